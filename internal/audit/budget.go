package audit

import (
	"encoding/json"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// A document, and every file its $refs name, is measured before anything
// decodes it into a tree (scanYAML, or the JSON decoder as it goes), and
// its tree is counted, aliases expanded, before kin-openapi decodes it
// (countTree), so that what it expands to, not only its size, bounds the
// work of the decoders: yaml.v3 into a node tree, then kin-openapi.

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
func (b *budget) limits() scanLimits {
	return scanLimits{nodes: b.nodes, depth: b.depth, pairs: b.pairs}
}

func (b *budget) spend(c counts) {
	b.nodes -= c.expanded
	b.pairs -= c.pairs
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
			if errors.Is(err, errLimit) {
				return nil, JSON, err
			}
			return nil, JSON, notValid(name, JSON, jsonErr)
		}
		return root, JSON, nil
	}
	root, err := b.decodeYAML(name, data)
	return root, YAML, err
}

// decodeYAML measures data's tokens against the budget, decodes it, and
// counts its tree, aliases expanded, against the budget.
func (b *budget) decodeYAML(name string, data []byte) (*yaml.Node, error) {
	if _, err := scanYAML(data, b.limits()); err != nil {
		return nil, notValid(name, YAML, err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, notValid(name, YAML, err)
	}
	c, err := countTree(&root, b.limits())
	if err != nil {
		return nil, notValid(name, YAML, err)
	}
	b.spend(c)
	return &root, nil
}

// notValid says that a document cannot be read, and for a limit how to
// raise it.
func notValid(name string, f Format, err error) error {
	switch {
	case errors.Is(err, errTooManyNodes):
		return fmt.Errorf("%s: %w; raise --max-nodes if it is really an API description", name, err)
	case errors.Is(err, errTooManyKeys):
		return fmt.Errorf("%s: %w; raise --max-nodes if it is really an API description", name, err)
	case errors.Is(err, errTooDeep):
		return fmt.Errorf("%s: %w; raise --max-depth if it is really an API description", name, err)
	}
	return fmt.Errorf("%s is not valid %s: %w", name, f, err)
}
