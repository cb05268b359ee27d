package audit

import (
	"encoding/json"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem/internal/audit/yamlevents"
)

// A document, and every file its $refs name, is counted before anything
// decodes it (package yamlevents), so that what it expands to, not only its
// size, bounds the work of the decoders after the count: yaml.v3 into a
// node tree, then kin-openapi.

// budget is what is left of the limits while a document and the files it
// refers to are read: the nodes and the pairs of keys are for all of them
// together, the depth for each.
type budget struct {
	nodes, pairs int64
	depth        int
}

func newBudget(opts Options) *budget {
	return &budget{nodes: opts.MaxNodes, pairs: opts.MaxNodes * keyPairsPerNode, depth: opts.MaxDepth}
}

// limits are the limits of the next file read.
func (b *budget) limits() yamlevents.Limits {
	return yamlevents.Limits{MaxNodes: b.nodes, MaxDepth: b.depth, MaxKeyPairs: b.pairs}
}

func (b *budget) spend(c yamlevents.Counts) {
	b.nodes -= c.Expanded
	b.pairs -= c.KeyPairs
}

// decode counts data against the budget and decodes it into a node tree:
// JSON as JSON (YAML refuses some of its escapes, such as \/ and surrogate
// pairs, and folds a raw U+0085), anything else, and anything that only
// looks like JSON ({openapi: 3.1.0}), as YAML.
func (b *budget) decode(name string, data []byte) (*yaml.Node, Format, error) {
	root := &yaml.Node{}
	format := detectFormat(data)
	if format == JSON {
		c, err := decodeJSON(data, root, b.limits())
		var syntax *json.SyntaxError
		switch {
		case err == nil:
			b.spend(c)
			return root, JSON, nil
		case !errors.As(err, &syntax):
			return nil, JSON, notValid(name, JSON, err)
		}
		jsonErr := err
		if root, err = b.decodeYAML(name, data); err != nil {
			if errors.Is(err, yamlevents.ErrLimit) {
				return nil, JSON, err
			}
			return nil, JSON, notValid(name, JSON, jsonErr)
		}
		return root, JSON, nil
	}
	root, err := b.decodeYAML(name, data)
	return root, YAML, err
}

// decodeYAML counts data's events against the budget, then decodes it.
func (b *budget) decodeYAML(name string, data []byte) (*yaml.Node, error) {
	c, err := yamlevents.Count(data, b.limits())
	if err != nil {
		return nil, notValid(name, YAML, err)
	}
	b.spend(c)
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, notValid(name, YAML, err)
	}
	return &root, nil
}

// notValid says that a document cannot be read, and for a limit how to
// raise it.
func notValid(name string, f Format, err error) error {
	switch {
	case errors.Is(err, yamlevents.ErrTooManyNodes):
		return fmt.Errorf("%s: %w; raise --max-nodes if it is really an API description", name, err)
	case errors.Is(err, yamlevents.ErrTooManyKeys):
		return fmt.Errorf("%s: %w; raise --max-nodes if it is really an API description", name, err)
	case errors.Is(err, yamlevents.ErrTooDeep):
		return fmt.Errorf("%s: %w; raise --max-depth if it is really an API description", name, err)
	}
	return fmt.Errorf("%s is not valid %s: %w", name, f, err)
}
