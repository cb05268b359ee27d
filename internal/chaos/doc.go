// Package chaos tests `idem serve` under faults: several proxy processes
// share one store while clients send requests with repeating keys, and the
// upstream, the network to the store and the proxies themselves fail at
// random. After the faults stop and recovery runs, Check verifies every
// key: the upstream acted at most once, the record is completed (with
// exactly the upstream's answer), needs review, or absent only if the
// upstream never acted, and every replay is byte-identical to the first
// answer.
//
// The parts: Relay (a fault-injecting TCP relay in front of a store),
// Upstream (a chaotic HTTP API that records its executions), Proc (one
// `idem serve` process, killed and restarted on its ports), Load (the
// clients), Check (the invariants) and Scenario, which runs them together.
// The tests in this package run a Scenario per server store; docs/chaos.md
// tells how to run them and which faults are emulated.
package chaos
