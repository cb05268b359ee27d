module github.com/idem-dev/idem/examples/frontdoors

go 1.26.8

require github.com/idem-dev/idem v0.0.0

replace github.com/idem-dev/idem => ../..
