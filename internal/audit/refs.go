package audit

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// kin-openapi resolves a $ref that leads into another file, and every
// $ref in such a file, once for each place that refers to it, holding a
// copy each time: a file of a few schemas that each refer four times to
// the one before expands to 4^n copies, in memory, without a file being
// read again (a chain of 30 held 8 GB and went on). So before kin-openapi
// resolves anything, refFanOut adds up what the document expands to with
// those $refs written out in full, each target counted once and
// remembered, and refuses a document over the node limit. A $ref inside
// the document to the document itself is resolved once, and counts once.

// refFanOut counts the nodes of root, the document at loc, with every
// $ref that leads into another file, and every $ref in other files,
// expanded, and returns an error wrapping errTooManyNodes when
// they pass opts.MaxNodes. Files it cannot read or decode, and targets it
// cannot find, count nothing: kin-openapi reports them.
func refFanOut(root *yaml.Node, loc *url.URL, base string, opts Options) error {
	r := &refCounter{loc: loc, base: base, opts: opts, budget: newBudget(opts),
		files: map[string]*yaml.Node{loc.Path: root}, memo: map[string]int64{}, active: map[string]bool{}}
	n := r.count(root, loc, true)
	if n > opts.MaxNodes {
		return fmt.Errorf("%w: more than %d nodes once the $refs into other files are written out, as they are resolved; raise --max-nodes if it is really an API description",
			errTooManyNodes, opts.MaxNodes)
	}
	return nil
}

type refCounter struct {
	loc    *url.URL
	base   string
	opts   Options
	budget *budget
	files  map[string]*yaml.Node // decoded, by path; nil: unreadable
	memo   map[string]int64      // what a target expands to, by path#pointer
	active map[string]bool       // targets being counted (a loop)
}

// count returns the nodes n expands to, in the file at at; main says that
// file is the document itself. It stops adding past the limit.
func (r *refCounter) count(n *yaml.Node, at *url.URL, main bool) int64 {
	if n == nil {
		return 0
	}
	if n.Kind == yaml.AliasNode {
		return r.count(deAlias(n), at, main) // countTree counted the aliases
	}
	total := int64(1)
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], deAlias(n.Content[i+1])
			if k.Value == "$ref" && v != nil && v.Kind == yaml.ScalarNode {
				total += r.ref(v.Value, at, main)
			}
		}
	}
	for _, c := range n.Content {
		if total > r.opts.MaxNodes {
			break
		}
		total += r.count(c, at, main)
	}
	return total
}

// ref returns what the $ref s, in the file at at, expands to: nothing for
// a $ref within the document itself.
func (r *refCounter) ref(s string, at *url.URL, main bool) int64 {
	u, err := url.Parse(s)
	if err != nil || main && u.Scheme == "" && u.Host == "" && u.Path == "" {
		return 0
	}
	target := at.ResolveReference(u)
	file, ok := r.file(target)
	if !ok {
		return 0
	}
	id := target.Path + "#" + target.Fragment
	if n, ok := r.memo[id]; ok {
		return n
	}
	if r.active[id] {
		return 0 // a loop: kin-openapi resolves it once
	}
	r.active[id] = true
	node := pointTo(file, target.Fragment)
	fileURL := &url.URL{Path: target.Path}
	n := r.count(node, fileURL, false)
	delete(r.active, id)
	r.memo[id] = n
	return n
}

// file returns the decoded file that u names, reading it once.
func (r *refCounter) file(u *url.URL) (*yaml.Node, bool) {
	if f, ok := r.files[u.Path]; ok {
		return f, f != nil
	}
	r.files[u.Path] = nil
	data, err := readRef(&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}, r.base, r.opts.MaxBytes)
	if err != nil {
		return nil, false
	}
	root, _, err := r.budget.decode(filepath.Base(u.Path), data)
	if err != nil {
		return nil, false
	}
	r.files[u.Path] = root
	return root, true
}

// pointTo returns the node the JSON Pointer p names in the document
// root, or nil.
func pointTo(root *yaml.Node, p string) *yaml.Node {
	n := root
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	if p == "" {
		return n
	}
	if !strings.HasPrefix(p, "/") {
		return nil
	}
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		n = deAlias(n)
		switch {
		case n == nil:
			return nil
		case n.Kind == yaml.MappingNode:
			n = mapValue(n, tok)
		case n.Kind == yaml.SequenceNode:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil
			}
			n = n.Content[i]
		default:
			return nil
		}
	}
	return n
}
