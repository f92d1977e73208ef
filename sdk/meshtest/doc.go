// Package meshtest is an in-memory mesh for a module author's unit tests:
// it runs an sdk.Module by the same rules as a meshd node (the sdk package
// doc, "What a module can rely on"), without a broker.
//
// It validates names, patterns, bodies and emit options; matches AMQP
// topic patterns; gives handlers the causation and the derived ids of a
// node; retries failed handlers with back-off and attempt counts,
// dead-letters permanent errors, panics, timeouts and events past the
// attempt limit with their reason and last error; de-duplicates event ids
// (AllowDuplicates aside); evaluates filters (Filtered lists what they
// rejected); validates each emit of a declared type against its schema
// (sdk.Module.Schemas) and dead-letters, with reason "schema", an event of
// a version its handler does not read (sdk.Module.Reads); and serves tools
// (checking requests and responses against their declared schemas) with ErrNoServer, deadlines, *sdk.ToolError
// codes and stored answers for repeated request ids. A handler's ctx
// carries its logger (sdk.Logger) and the event's trace, as on a node.
// Stub and StubAnswer stand in for a tool another module serves; Calls
// lists what every call sent and got. Explain says what became of one
// event (routed nowhere, filtered, each attempt, a dead letter's reason, a
// handler's refused emit or call): put it in a failure's message. Grants
// hold a module to its node-config entry's grants, with meshd's words.
// WaitRun waits for a module's Run
// and returns its error; a Run that fails stops the module's handling, as
// on a node. The conformance suite (test/conformance) holds it to the
// runtime's behaviour.
//
// It is deterministic. Emits queue their events; Settle runs everything
// pending, in queue order, until the mesh is quiet (a module's handlers
// one at a time, or up to its Concurrency at once on goroutines),
// moving its clock straight to each retry's time, so a test of back-off
// takes no time. An event's time to live (sdk.WithTTL) runs on that
// clock: one that runs out before a handler takes it is dead-lettered as
// "expired". Now and Advance read and move the clock. Handler
// timeouts and call deadlines are real time (a handler sees them through
// its ctx). Tool calls run in the calling goroutine.
//
// Importing it pulls in neither a broker client nor gRPC.
//
//	func TestNotifier(t *testing.T) {
//		mt := meshtest.New(meshtest.Config{})
//		defer mt.Close()
//		if err := mt.Load(notifier.Module(nil), meshtest.ModuleConfig{}); err != nil {
//			t.Fatal(err)
//		}
//		mt.Emit(ctx, "umami", "module.umami.site.created", Site{ID: 1, Name: "example.org"})
//		mt.Settle()
//		for _, ev := range mt.Emitted() { ... }
//		if dl := mt.DeadLetters(); len(dl) > 0 { t.Errorf("dead letters: %+v", dl) }
//	}
package meshtest
