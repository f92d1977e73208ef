// Package fault holds the fault-injection tests of issue 5: the broker
// application stopped and started, every connection closed by the broker,
// meshd SIGKILLed with events in its spool, a queue at its length limit,
// and a poison event replayed from the dead letters. Each test ends with
// one summary line (emitted, confirmed, handled, duplicates suppressed,
// dead-lettered, lost), and lost must be 0.
//
// Some of them stop or cut the whole broker, so they are built only with
// the fault tag and `make test` runs them after every other package, one
// at a time:
//
//	go test -race -count=1 -p 1 -v -tags fault ./test/fault
package fault
