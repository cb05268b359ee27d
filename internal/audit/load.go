package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"
)

// DefaultMaxBytes is the largest document (and the largest file any of its
// $refs names) that Load reads unless told otherwise: large enough for the
// biggest public API descriptions. Bytes alone do not bound what parsing
// takes (a 30 MB YAML list of "- [a]" is ten million nodes, and a few
// hundred bytes of aliases expand to billions), so the nodes are bounded
// too: DefaultMaxNodes.
const DefaultMaxBytes = 32 << 20

// DefaultMaxNodes bounds the nodes of a document and the files its $refs
// name, together (mapping keys count as nodes), with every YAML alias
// counted as the nodes it expands to: room above the largest public API
// description we know of (GitHub's, about 510,000 nodes, 21 levels deep).
// A node costs about 500 bytes across the parsers in block-style YAML and
// in JSON (read by encoding/json), and up to about 1.5 KB in YAML flow
// mappings, whose content kin-openapi's YAML parser (go.yaml.in/yaml/v4)
// holds as tokens until the mapping's entry ends: a document at the limit
// peaks at about 230 MB resident as JSON and 360 MB as YAML.
const DefaultMaxNodes = 600_000

// DefaultMaxDepth bounds how deeply a document's sequences and mappings
// (JSON arrays and objects) nest; API descriptions rarely pass 30.
const DefaultMaxDepth = 500

// keyPairsPerNode bounds the pairs of keys of each mapping, added up (a
// mapping of k keys has k(k-1)/2), per node of Options.MaxNodes: the YAML
// decoder kin-openapi uses compares every pair to find duplicates. GitHub's
// description has about 4 million pairs; 50 per node allows 50 million,
// about a second of comparing.
const keyPairsPerNode = 50

// Format is how a document is written.
type Format int

// The formats a document can come in; a fixed copy keeps its input's.
const (
	YAML Format = iota
	JSON
)

// String names the format.
func (f Format) String() string {
	if f == JSON {
		return "JSON"
	}
	return "YAML"
}

// Options tune Load and Parse.
type Options struct {
	// MaxBytes bounds the document and each file it refers to. Defaults to
	// DefaultMaxBytes.
	MaxBytes int64
	// MaxNodes bounds the nodes of the document and the files it refers
	// to, together, as DefaultMaxNodes says, and with it the pairs of
	// keys their mappings hold (50 per node). Defaults to DefaultMaxNodes.
	MaxNodes int64
	// MaxDepth bounds how deeply the document and each file it refers to
	// nest. Defaults to DefaultMaxDepth.
	MaxDepth int
}

func (o Options) withDefaults() Options {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxNodes <= 0 {
		o.MaxNodes = DefaultMaxNodes
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	return o
}

// Document is a loaded OpenAPI 3.0 or 3.1 document: the library's model for
// auditing, and the node tree that a fix edits so that everything it does
// not touch (order, comments, style) survives.
type Document struct {
	// Name is where the document came from, for messages.
	Name string
	// Format is YAML or JSON, detected from the content.
	Format Format
	// Version is the document's "openapi" field, such as "3.1.0".
	Version string

	root *yaml.Node // the document node
	spec *openapi3.T
	loc  *url.URL // where the document lives, for $refs to other files
	data []byte   // as read
	opts Options  // as loaded, defaults filled
}

// Load reads and parses the OpenAPI document at path. $refs to other local
// files are followed when they stay inside the document's directory; remote
// $refs (http, https or any other scheme) are refused: auditing never uses
// the network.
func Load(ctx context.Context, path string, opts Options) (*Document, error) {
	opts = opts.withDefaults()
	data, err := readCapped(path, opts.MaxBytes)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	return parse(ctx, data, path, &url.URL{Path: filepath.ToSlash(abs)}, opts)
}

// Parse parses a document held in memory. It has no directory, so any $ref
// to another file is refused.
func Parse(ctx context.Context, data []byte, name string, opts Options) (*Document, error) {
	opts = opts.withDefaults()
	if int64(len(data)) > opts.MaxBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes; raise the limit if it is really an API description", name, opts.MaxBytes)
	}
	return parse(ctx, data, name, nil, opts)
}

func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not an OpenAPI document", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes; raise the limit if it is really an API description", path, limit)
	}
	return data, nil
}

func parse(ctx context.Context, data []byte, name string, loc *url.URL, opts Options) (*Document, error) {
	d := &Document{Name: name, Format: detectFormat(data), loc: loc, data: data, opts: opts}
	b := newBudget(opts)
	root, format, err := b.decode(name, data)
	if err != nil {
		return nil, err
	}
	d.Format = format
	top := docMapping(root)
	if top == nil {
		return nil, fmt.Errorf("%s is not an OpenAPI document: its top level is not a mapping", name)
	}
	d.root = root
	if v := mapValue(top, "openapi"); v != nil && v.Kind == yaml.ScalarNode {
		d.Version = v.Value
	}
	switch {
	case d.Version == "" && mapValue(top, "swagger") != nil:
		return nil, fmt.Errorf("%s is a Swagger 2.0 document; convert it to OpenAPI 3 first", name)
	case d.Version == "":
		return nil, fmt.Errorf("%s is not an OpenAPI document: it has no \"openapi\" field", name)
	case !strings.HasPrefix(d.Version, "3."):
		return nil, fmt.Errorf("%s declares OpenAPI %q; idem audit reads 3.0 and 3.1", name, d.Version)
	}
	loader := openapi3.NewLoader()
	loader.Context = ctx
	base := ""
	if loc != nil {
		base = filepath.Dir(filepath.FromSlash(loc.Path))
	}
	if loc != nil {
		if err := refFanOut(root, loc, base, opts); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		data, err := readRef(u, base, opts.MaxBytes)
		if err != nil {
			return nil, err
		}
		// kin-openapi decodes the file as YAML and, where YAML fails, as
		// JSON: decode counts it as both would read it.
		if _, _, err := b.decode(u.Path, data); err != nil {
			return nil, err
		}
		return data, nil
	}
	var spec *openapi3.T
	switch {
	case format == JSON && json.Valid(data):
		// Strict JSON (decode read it as JSON, not as YAML) goes through
		// encoding/json, as kin-openapi's own JSON path does: its YAML
		// parser holds a flow mapping's content as tokens until the entry
		// ends, several times what the document's nodes take otherwise.
		spec, err = loadJSON(loader, data, loc)
	case loc != nil:
		spec, err = loader.LoadFromDataWithPath(data, loc)
	default:
		spec, err = loader.LoadFromData(data)
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d.spec = spec
	return d, nil
}

// loadJSON decodes a document that is strict JSON into the model and
// resolves its $refs, as Loader.LoadFromData would after its own decoding.
func loadJSON(loader *openapi3.Loader, data []byte, loc *url.URL) (*openapi3.T, error) {
	spec := &openapi3.T{}
	if err := spec.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	if err := loader.ResolveRefsIn(spec, loc); err != nil {
		return nil, err
	}
	return spec, nil
}

// errRemoteRef is returned for a $ref that would need the network.
var errRemoteRef = errors.New("remote $ref refused: idem audit never fetches over the network; bundle the document first")

// readRef reads a file that a $ref names: a local file under base, capped
// in size. Anything with a scheme other than file is refused.
func readRef(u *url.URL, base string, limit int64) ([]byte, error) {
	if (u.Scheme != "" && u.Scheme != "file") || u.Host != "" {
		return nil, fmt.Errorf("%s: %w", u.Redacted(), errRemoteRef)
	}
	if base == "" {
		return nil, fmt.Errorf("$ref to another file (%s) needs the document to be read from a file", u.Path)
	}
	p := filepath.Clean(filepath.FromSlash(u.Path))
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	rel, err := filepath.Rel(base, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("$ref to %s leaves the document's directory %s; refused", u.Path, base)
	}
	return readCapped(p, limit)
}

func detectFormat(data []byte) Format {
	t := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(t) > 0 && t[0] == '{' {
		return JSON
	}
	return YAML
}

// docMapping returns the top-level mapping of a parsed document node.
func docMapping(n *yaml.Node) *yaml.Node {
	if n == nil || n.Kind != yaml.DocumentNode || len(n.Content) == 0 {
		return nil
	}
	m := n.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil
	}
	return m
}

// mapValue returns the value under key in mapping m, following an alias, or
// nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	m = deAlias(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return deAlias(m.Content[i+1])
		}
	}
	return nil
}

func deAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}
