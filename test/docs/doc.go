// Package docs checks that the documentation still works: its test runs
// the runnable commands of README.md and of the guides in docs/, in order,
// against the local RabbitMQ, each file in a virtual host of its own, so
// the docs cannot rot. It has no code but its test; the convention that
// marks a block runnable, and what a block can rely on, are written at the
// top of docs_test.go and in the README's "Tests" section.
//
//	go test -count=1 ./test/docs
package docs
