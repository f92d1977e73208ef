package runtime

// TestHooks are points tests order against, instead of hoping for an
// ordering with timing; see the hooks type.
type TestHooks struct {
	// Resumed: the supervisor has brought every module back on a new
	// session.
	Resumed func()
	// SetUp: a module's Setup returned; it is not attachable yet.
	SetUp func(module string)
	// Relaunched: a crashed module process was started again and is not
	// installed yet.
	Relaunched func(module string, pid int)
	// StopWaiting: a module process's Stop waits for its supervisor.
	StopWaiting func(module string)
	// Exited: a module process is gone, and its supervisor has not taken
	// it out yet.
	Exited func(module string)
	// Awaiting: a delivery or call waits for the module process's restart.
	Awaiting func(module string)
	// Reconsume: a consumed queue that was lost is about to be consumed
	// again (its attempt-th try).
	Reconsume func(queue string, attempt int)
	// DrainWaits: the spool's drain published a batch and is about to
	// wait for its confirms (new appends held back if it is the last).
	DrainWaits func()
	// Refused: a module stopped for good, its process started again as
	// another module.
	Refused func(module string)
	// Record: what recording a handled event's id returns, given what it
	// did return (a full disk, forced).
	Record func(id string, err error) error
	// WriteRecords: what writing down the handled ids recorded since the
	// last write returns, given what it did return (a full disk, forced);
	// the acks of their deliveries wait for it.
	WriteRecords func(err error) error
	// Unseen: whether a worker drops the delivery it got from queue,
	// neither handled nor settled, as if the broker had checked it out to
	// the consumer and never delivered it.
	Unseen func(queue string) bool
	// LookedAt: the node looked at its modules' queues, for the metrics
	// mesh.queue.depth and mesh.queue.consumers.
	LookedAt func()
	// Checked: a module's consumers were checked once.
	Checked func(module string)
	// Launched: a module process passed the handshake and is about to be
	// asked to describe itself.
	Launched func(path string, pid int)
	// Described: a module process described itself at its first load and
	// the module is loaded; the process is not started yet.
	Described func(module string, pid int)
	// IntakeMarker: a group's intake member reached a marker of a
	// partition count change and handles it when this returns.
	IntakeMarker func(marker string)
	// CaughtUp: an event of a change's catch-up queue was settled.
	CaughtUp func(queue string)
	// IntakeSend: the intake is about to send an event of key on to its
	// partition; an error it returns fails that send (as a broker's
	// negative confirm would).
	IntakeSend func(key string) error
}

// SetTestHooks makes the node call h's functions (those set).
func (n *Node) SetTestHooks(h TestHooks) {
	n.hooks.Store(&hooks{resumed: h.Resumed, setUp: h.SetUp, relaunched: h.Relaunched, stopWaiting: h.StopWaiting, exited: h.Exited, awaiting: h.Awaiting, reconsume: h.Reconsume, drainWaits: h.DrainWaits, refused: h.Refused, record: h.Record, writeRecords: h.WriteRecords, unseen: h.Unseen, lookedAt: h.LookedAt, checked: h.Checked, launched: h.Launched, described: h.Described, intakeMarker: h.IntakeMarker, caughtUp: h.CaughtUp, intakeSend: h.IntakeSend})
}

// ErrDescribesAnother is errDescribesAnother, for tests.
var ErrDescribesAnother = errDescribesAnother
