package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver OpenSQLite opens

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/outboxstore"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Outbox is a module's outbox in its database. It is safe for concurrent
// use.
type Outbox struct {
	db        *sql.DB
	store     *outboxstore.Store
	module    string
	emits     []string
	contracts *schema.Contracts
	cfg       config
	wake      chan struct{} // an Emit happened: its row may be committed soon
	relaying  atomic.Bool
	now       func() time.Time
	// afterPublish, if set (tests), runs after each row the mesh
	// confirmed, before it is marked sent; an error there stops the pass
	// as a crash would, the row unmarked. afterPass gets each pass's count.
	afterPublish func(id string) error
	afterPass    func(sent int)
}

// Option is a setting of an Outbox (New).
type Option func(*config)

type config struct {
	dialect      outboxstore.Dialect
	retention    time.Duration
	poll         time.Duration
	batch        int
	maxBodyBytes int
	lease        time.Duration
	inFlight     int
}

// Retention keeps sent rows for d before the relay deletes them (default
// 24 hours; 0 deletes them at the relay's next pruning, about once a
// minute). A kept row says when its event was sent.
func Retention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// PollInterval is how often the relay looks for rows it was not told of
// (default 100ms): rows committed by another process sharing the database,
// or after a restart. Rows written by this process's Emit are looked for
// at once after it, and again, more and more slowly, until they are
// committed or the interval is reached.
func PollInterval(d time.Duration) Option { return func(c *config) { c.poll = d } }

// InFlight lets the relay keep up to n rows in flight at once, each
// published as soon as it is read, instead of one at a time (the
// default, n = 1). Rows are still read and handed to the mesh in commit
// order, but those in flight together may reach the broker, and their
// consumers, in another order (as EmitAsync's do), and one that fails
// for a while is sent again after later ones. Use it for throughput when
// consumers do not rely on the module's order.
func InFlight(n int) Option { return func(c *config) { c.inFlight = n } }

// MaxBodyBytes is the largest body Emit accepts (default 1 MiB, the
// node's default max_body_bytes). A row whose body is over the node's own
// limit is set aside when relayed.
func MaxBodyBytes(n int) Option { return func(c *config) { c.maxBodyBytes = n } }

// PostgreSQL says the database is PostgreSQL, and SQLite that it is
// SQLite, for a driver New does not recognise (it knows modernc's
// "sqlite" and pgx's "pgx").
func PostgreSQL() Option { return func(c *config) { c.dialect = outboxstore.PostgreSQL } }

// SQLite is the counterpart of PostgreSQL.
func SQLite() Option { return func(c *config) { c.dialect = outboxstore.SQLite } }

// leaseOption shortens the relay's lease, for tests of the take-over.
func leaseOption(d time.Duration) Option { return func(c *config) { c.lease = d } }

// Errors New and Emit wrap.
var (
	// ErrUnknownDatabase is returned by New for a driver it does not
	// recognise and no PostgreSQL or SQLite option.
	ErrUnknownDatabase = errors.New("outbox: unknown database")
	// ErrNewerFormat is returned by New for outbox tables a later release
	// of mesh made (a rollback): they are left as they are.
	ErrNewerFormat = outboxstore.ErrNewerFormat
	// ErrRelaying is returned by Relay and Flush while another Relay or
	// Flush of the same Outbox runs.
	ErrRelaying = errors.New("outbox: this outbox is relayed already")
	// ErrHeld is returned by Flush while a relay of another Outbox (in
	// this process or another sharing the database) holds the outbox.
	ErrHeld = errors.New("outbox: another relay holds this outbox")
)

// New makes the outbox's tables in db if they are missing (or checks
// those there) and returns the outbox of module, the sdk.Module whose
// process holds db: its Name scopes the outbox's event ids, and its Emits
// and Schemas are what Emit checks each event against, as the mesh's
// Emit does.
func New(ctx context.Context, db *sql.DB, module sdk.Module, opts ...Option) (*Outbox, error) {
	cfg := config{retention: 24 * time.Hour, poll: 100 * time.Millisecond, batch: 256, maxBodyBytes: 1 << 20, lease: 15 * time.Second, inFlight: 1}
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	switch {
	case cfg.retention < 0:
		return nil, fmt.Errorf("outbox: %w: retention %v is negative", sdk.ErrInvalid, cfg.retention)
	case cfg.poll <= 0:
		return nil, fmt.Errorf("outbox: %w: poll interval %v is not positive", sdk.ErrInvalid, cfg.poll)
	case cfg.inFlight < 1 || cfg.inFlight > 4096:
		return nil, fmt.Errorf("outbox: %w: %d rows in flight, want 1 to 4096", sdk.ErrInvalid, cfg.inFlight)
	case cfg.maxBodyBytes <= 0:
		return nil, fmt.Errorf("outbox: %w: max body bytes %d is not positive", sdk.ErrInvalid, cfg.maxBodyBytes)
	}
	if err := wire.ValidateModule(module.Name, module.Kind, module.Emits, module.Calls); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if cfg.dialect == 0 {
		cfg.dialect = dialectOf(db)
		if cfg.dialect == 0 {
			return nil, fmt.Errorf("%w: driver %T; say which with outbox.SQLite() or outbox.PostgreSQL()", ErrUnknownDatabase, db.Driver())
		}
	}
	decls := make([]schema.Decl, len(module.Schemas))
	for i, s := range module.Schemas {
		decls[i] = schema.Decl{Event: s.Event, Tool: s.Tool, Version: s.Version, JSON: s.JSON, Response: s.Response}
	}
	contracts, err := schema.New(module.Name, module.Emits, decls, module.Reads, true)
	if err != nil {
		return nil, fmt.Errorf("outbox: the module's schemas: %w", err)
	}
	store, err := outboxstore.Open(ctx, db, cfg.dialect)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Outbox{db: db, store: store, module: module.Name, emits: module.Emits, contracts: contracts, cfg: cfg,
		wake: make(chan struct{}, 1), now: time.Now}, nil
}

// dialectOf recognises the drivers the outbox is tested with.
func dialectOf(db *sql.DB) outboxstore.Dialect {
	switch t := fmt.Sprintf("%T", db.Driver()); {
	case strings.Contains(t, "sqlite"):
		return outboxstore.SQLite
	case strings.Contains(t, "stdlib") || strings.Contains(t, "pgx") || strings.Contains(t, "pq."):
		return outboxstore.PostgreSQL
	}
	return 0
}

// sqliteConns is how many connections OpenSQLite's pool keeps open.
const sqliteConns = 4

// OpenSQLite opens (or creates) the SQLite database at path, set up for a
// module's state and its outbox: write-ahead logging, every commit synced
// to disk, and a writer waiting up to 10 s for another instead of failing
// at once. In a module process, put it in the module's directory
// (process.Dir()). Its pool holds 4 connections, and every transaction
// takes the write lock at its start: inside a transaction, query through
// it (tx), never through db, which could wait for a connection the
// transactions hold.
func OpenSQLite(path string) (*sql.DB, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(ON)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate") // a writer takes the lock at BEGIN, never fails midway on it
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	// SQLite has one writer at a time: a few connections keep readers
	// (the relay) beside a writer, and the other writers wait their turn
	// in database/sql's queue, in order, instead of in SQLite's busy
	// handler, which polls, out of order, and fails a writer that waited
	// past its timeout while hundreds compete.
	db.SetMaxOpenConns(sqliteConns)
	return db, nil
}

// Emit writes an event of type module.<module>.<name> (or name itself,
// with sdk.AsFullType) with body marshalled to JSON into the outbox, in
// tx: the event exists if and only if tx commits. It returns the event's
// id, fixed now; the relay (Relay) publishes the event once tx committed,
// with that id, as often as it must (after a crash, say) and the mesh's
// consumers absorb the repeats by id.
//
// The body is checked here as the mesh's Emit checks it: valid JSON
// within the size limit, and against the schema the module declares for
// the event (its x-schema is set to that version). Options are Emit's:
// sdk.WithSchema, WithTTL, WithPriority, AsFullType, WithFreshID, After
// and At (a delay counts from now, not from when the relay sends it).
// sdk.AtMostOnce is refused: an outbox row is published at least once.
//
// Inside a handler (ctx is the one it was given), the event's cause is
// the handled event or request and its id derives from it: the same
// handling run again (after a rollback, or a retry) writes the same ids,
// and a row of an id already written is kept as it was. WithFreshID gives
// a fresh id instead.
//
// Errors: sdk.ErrInvalid for a bad name, body or option; sdk.ErrForbidden
// for a name the module does not declare in its Emits (the outbox does
// not know the node config's allow_undeclared_emits: declare it); or the
// database's error writing the row.
func (o *Outbox) Emit(ctx context.Context, tx *sql.Tx, name string, body any, opts ...sdk.EmitOption) (string, error) {
	if tx == nil {
		return "", fmt.Errorf("outbox emit %s: %w: no transaction", name, sdk.ErrInvalid)
	}
	eo, err := wire.ApplyEmitOptions(opts)
	if err == nil {
		err = eo.Check()
	}
	if err == nil && eo.AtMostOnce {
		err = fmt.Errorf("%w: an outbox row is published at least once: drop sdk.AtMostOnce", sdk.ErrInvalid)
	}
	if err != nil {
		return "", fmt.Errorf("outbox emit %s: %w", name, err)
	}
	eventType, err := o.eventType(name, eo.FullType)
	if err != nil {
		return "", fmt.Errorf("outbox emit: %w", err)
	}
	raw, err := wire.EncodeBody(body, o.cfg.maxBodyBytes)
	if err == nil {
		eo.Schema, err = o.contracts.Emit(eventType, raw, eo.Schema)
	}
	if err != nil {
		return "", fmt.Errorf("outbox emit %s: %w", eventType, err)
	}
	now := o.now()
	if err := eo.CheckDue(now); err != nil {
		return "", fmt.Errorf("outbox emit %s: %w", eventType, err)
	}
	ref, inHandling := causation.NextOutbox(ctx)
	if !inHandling || eo.FreshID {
		ref = causation.OutboxRef{Scope: o.store.Epoch(), N: randomN(), Time: now}
	}
	stored := outboxstore.Options{Schema: eo.Schema, TTLMillis: eo.TTL.Milliseconds(), Cause: causation.From(ctx),
		Scope: ref.Scope, N: ref.N, IDUnixMillis: ref.Time.UnixMilli()}
	if eo.HasPriority {
		p := eo.Priority
		stored.Priority = &p
	}
	if eo.Delayed() {
		stored.AtUnixMillis = eo.Due(now).UnixMilli()
	}
	id := causation.OutboxID(o.module, ref)
	if _, err := o.store.Append(ctx, tx, outboxstore.Row{ID: id, Type: eventType, Body: raw, Options: stored, WrittenAt: now}); err != nil {
		return "", fmt.Errorf("outbox emit %s: %w", eventType, err)
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return id, nil
}

// eventType is the full type of an emit of name, if the module may emit
// it as far as the outbox knows: a full type outside the module's
// namespace is left to the node's grants (a refused row is set aside
// when relayed).
func (o *Outbox) eventType(name string, full bool) (string, error) {
	if full && !strings.HasPrefix(name, "module."+o.module+".") {
		return name, wire.ValidateEventType(name)
	}
	t, err := wire.EmitType(o.module, name, full, nil)
	if err == nil {
		err = wire.CheckDeclared(o.module, t, o.emits)
	}
	return t, err
}

func randomN() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand's Read does not fail
	return binary.BigEndian.Uint64(b[:])
}

// Backlog is what waits in an outbox.
type Backlog struct {
	// Unsent counts the rows committed and not yet published.
	Unsent int64
	// Oldest is when the oldest of them was written; zero for none.
	Oldest time.Time
	// SetAside counts the rows the mesh refused for good (a type the
	// module may not emit, say): the relay logged each with its reason
	// and goes on without them; they stay in the table (mesh_outbox,
	// failed) for the operator.
	SetAside int64
}

// Backlog says what waits in the outbox.
func (o *Outbox) Backlog(ctx context.Context) (Backlog, error) {
	b, err := o.store.Backlog(ctx)
	return Backlog{Unsent: b.Unsent, Oldest: b.Oldest, SetAside: b.Failed}, err
}

// Relay publishes the outbox's committed rows through m, in commit order,
// one at a time (each once the previous is confirmed; see InFlight for
// more at once), marks them sent,
// and deletes them after the retention, until ctx ends. Its shape is
// sdk.Module's Run: a module whose only work of its own is its outbox
// sets Run to it (Run: ob.Relay); one with more runs it on a goroutine
// of its Run.
//
// A row the mesh refuses for good (sdk.ErrInvalid, sdk.ErrForbidden) is
// set aside with its reason and logged; any other failure (the broker
// away, the node stopping) is tried again, with back-off, from the same
// row, so order holds. A row published whose mark did not reach the
// database (a crash just then) is published again with the same id.
//
// Several processes may share the database (PostgreSQL, several nodes
// running the module): one relay at a time holds the outbox, by a lease
// it renews and a lock the system frees when its process ends (a flock
// beside a SQLite database, an advisory lock of its own session on
// PostgreSQL). Another takes over within about a second once that
// process is gone, and within about 15 s of its last renewal where
// PostgreSQL has not seen its session end (a lost machine). On
// PostgreSQL the relay keeps one connection of db's pool for itself
// while it holds the outbox: a pool limited to one connection
// (SetMaxOpenConns(1)) would leave it none to read the rows with.
//
// It returns nil when ctx ends or the mesh closes, ErrRelaying while
// another Relay of o runs.
func (o *Outbox) Relay(ctx context.Context, m sdk.Mesh) error {
	if !o.relaying.CompareAndSwap(false, true) {
		return ErrRelaying
	}
	defer o.relaying.Store(false)
	r := &relay{o: o, m: m, log: m.Logger().With("outbox", o.module), holder: holderName()}
	return r.run(ctx)
}

// Flush publishes, now, the rows committed so far, as Relay would, and
// says how many it published. It is for tests and for a module that wants
// its backlog out before it goes on; a module's Relay does it anyway.
// It returns ErrHeld while another relay holds the outbox.
func (o *Outbox) Flush(ctx context.Context, m sdk.Mesh) (int, error) {
	if !o.relaying.CompareAndSwap(false, true) {
		return 0, ErrRelaying
	}
	defer o.relaying.Store(false)
	r := &relay{o: o, m: m, log: m.Logger().With("outbox", o.module), holder: holderName()}
	defer r.release(ctx)
	total := 0
	for {
		held, err := r.lease(ctx)
		if err != nil {
			return total, err
		}
		if !held {
			return total, ErrHeld
		}
		n, full, err := r.pass(ctx)
		total += n
		if err != nil || !full {
			return total, err
		}
	}
}

func holderName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// relay is one run of Relay.
type relay struct {
	o      *Outbox
	m      sdk.Mesh
	log    *slog.Logger
	holder string
	until  time.Time              // the lease held, if after now
	lock   *outboxstore.RelayLock // held with the lease
	noLock bool                   // the database has no relay lock: the lease alone
	lapsed outboxstore.LeaseRow   // a lease seen run out while another held the lock (standBy)
	pruned time.Time
	// errors counts the failed passes and leases; reported is when the
	// backlog was last reported to the host (report).
	errors   uint64
	reported time.Time
}

// reportEvery is how often the relay tells the host its backlog.
const reportEvery = time.Second

// report tells the host the outbox's backlog, for the node's metrics
// (mesh_outbox_*), about once a second, when the host keeps them.
func (r *relay) report(ctx context.Context) {
	rep, ok := r.m.(wire.OutboxReporter)
	if !ok || time.Since(r.reported) < reportEvery {
		return
	}
	b, err := r.o.store.Backlog(ctx)
	if err != nil {
		return
	}
	r.reported = time.Now()
	rep.ReportOutbox(wire.OutboxStats{Unsent: b.Unsent, Oldest: b.Oldest, SetAside: b.Failed, RelayErrors: r.errors})
}

// pruneEvery is how often the relay deletes the rows past their
// retention.
const pruneEvery = time.Minute

func (r *relay) run(ctx context.Context) error {
	o := r.o
	defer r.release(ctx)
	backoff := time.Duration(0)
	quick := time.Duration(0) // polling for rows an Emit just wrote
	for {
		wait := o.cfg.poll
		held, err := r.lease(ctx)
		switch {
		case err != nil:
			r.log.Warn("outbox relay: lease", "err", err)
			r.errors++
			backoff = nextBackoff(backoff)
			wait = backoff
		case !held:
			wait = min(o.cfg.lease/3, time.Second) // another relay has it: look again soon
		default:
			sent, full, err := r.pass(ctx)
			if o.afterPass != nil {
				o.afterPass(sent)
			}
			switch {
			case errors.Is(err, sdk.ErrClosed) || ctx.Err() != nil:
				return nil
			case err != nil:
				r.log.Warn("outbox relay: will try again", "err", err)
				r.errors++
				backoff = nextBackoff(backoff)
				wait = backoff
			case full:
				backoff, quick = 0, 0
				continue
			default:
				backoff = 0
				if sent > 0 {
					quick = 0
				} else if quick > 0 && quick < o.cfg.poll {
					wait, quick = quick, quick*2
				}
			}
			r.prune(ctx)
			r.report(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.wake:
			quick = time.Millisecond
		case <-time.After(wait):
		}
	}
}

// release gives the lease up, if the relay holds it, and the relay
// lock, so another takes over at once.
func (r *relay) release(ctx context.Context) {
	defer r.unlock()
	if !time.Now().Before(r.until) {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := r.o.store.Release(rctx, r.holder); err != nil {
		r.log.Warn("outbox relay: lease not released; another relay takes over once this one's lock is free", "err", err)
	}
}

func nextBackoff(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return 100 * time.Millisecond
	case d >= 5*time.Second:
		return 5 * time.Second
	}
	return 2 * d
}

// lease holds the outbox's lease, renewing it once half of it is spent.
// A relay holds the outbox's relay lock (outboxstore.RelayLock) for as
// long as it holds the lease: taking the lock proves that the lease's
// holder, if another, is gone (its process ended), so the lease is taken
// at once rather than waited out. A database without the lock (SQLite in
// memory) goes by the lease alone.
func (r *relay) lease(ctx context.Context) (bool, error) {
	now := time.Now()
	if now.Before(r.until.Add(-r.o.cfg.lease / 2)) {
		return true, nil
	}
	if r.noLock {
		ok, err := r.o.store.Lease(ctx, r.holder, now, r.o.cfg.lease)
		if err != nil || !ok {
			r.until = time.Time{}
			return false, err
		}
		r.until = now.Add(r.o.cfg.lease)
		return true, nil
	}
	if r.lock == nil {
		l, err := r.o.store.TryRelayLock(ctx)
		switch {
		case errors.Is(err, outboxstore.ErrNoRelayLock):
			r.noLock = true
			return r.lease(ctx)
		case err != nil:
			r.until = time.Time{}
			return false, err
		case l == nil:
			r.until = time.Time{}
			r.standBy(ctx, now)
			return false, nil
		}
		r.lock = l
	}
	was, err := r.o.store.Seize(ctx, r.lock, r.holder, now, r.o.cfg.lease)
	if err != nil {
		r.unlock()
		return false, err
	}
	if was.Holder != "" && was.Holder != r.holder && was.Until.After(now) {
		r.log.Info("outbox relay: holder gone, its lease taken over at once (its relay lock was free)",
			"previous_holder", was.Holder, "lease_until", was.Until.UTC().Format(time.RFC3339Nano))
	}
	r.until = now.Add(r.o.cfg.lease)
	return true, nil
}

// standBy is a relay's look at the lease while another holds the relay
// lock: a lease seen run out twice in a row, unrenewed, is that of a
// holder whose session the database has not yet seen end (PostgreSQL: a
// lost machine); that session is ended, so the lock comes free.
func (r *relay) standBy(ctx context.Context, now time.Time) {
	row, err := r.o.store.LeaseHolder(ctx)
	if err != nil || row.Holder == "" || !row.Until.Before(now) {
		r.lapsed = outboxstore.LeaseRow{}
		return
	}
	if row != r.lapsed {
		r.lapsed = row // seen once: looked at again at the next stand-by
		return
	}
	ended, err := r.o.store.EndLapsedHolder(ctx, row)
	switch {
	case err != nil:
		r.log.Warn("outbox relay: the lease ran out and its holder still holds the relay lock; could not end its session", "holder", row.Holder, "err", err)
	case ended:
		r.log.Warn("outbox relay: the lease ran out while its holder's session still held the relay lock: that session is ended", "holder", row.Holder,
			"lease_until", row.Until.UTC().Format(time.RFC3339Nano))
	}
}

// unlock gives the relay lock up, and with it the lease.
func (r *relay) unlock() {
	r.until = time.Time{}
	if r.lock != nil {
		_ = r.lock.Close()
		r.lock = nil
	}
}

// pass publishes one batch of pending rows in order. It says how many
// went, and whether the batch was full (more may wait).
func (r *relay) pass(ctx context.Context) (sent int, full bool, err error) {
	o := r.o
	rows, bad, err := o.store.Pending(ctx, o.cfg.batch)
	if err != nil {
		return 0, false, err
	}
	var done []int64
	defer func() {
		if len(done) == 0 {
			return
		}
		mctx := context.WithoutCancel(ctx) // what the broker confirmed is marked, even as the relay stops
		if merr := o.store.MarkSent(mctx, time.Now(), done...); merr != nil && err == nil {
			err = merr // sent again with the same ids at the next pass
		}
	}()
	results := r.publish(ctx, rows, bad)
	var stop error
	for i, row := range rows {
		perr := results[i]
		if perr == nil && o.afterPublish != nil {
			if herr := o.afterPublish(row.ID); herr != nil {
				return len(done), false, herr // the process died before the mark
			}
		}
		switch {
		case bad[row.Seq] != nil:
			r.setAside(ctx, row, bad[row.Seq])
		case errors.Is(perr, errNotTried):
		case perr == nil:
			done = append(done, row.Seq)
		case errors.Is(perr, wire.ErrNotStarted) || errors.Is(perr, sdk.ErrTransient) || errors.Is(perr, sdk.ErrClosed) || ctx.Err() != nil:
			stop = cmp.Or(stop, perr)
		case errors.Is(perr, sdk.ErrInvalid) || errors.Is(perr, sdk.ErrForbidden):
			r.setAside(ctx, row, perr)
		default:
			stop = cmp.Or(stop, perr)
		}
	}
	if stop != nil || slices.ContainsFunc(results, func(err error) bool { return errors.Is(err, errNotTried) }) {
		return len(done), stop == nil, stop // not tried: the lease ran out under a slow publish; renew, then go on
	}
	return len(done), len(rows) == o.cfg.batch, nil
}

// errNotTried is the result of a row the pass did not publish.
var errNotTried = errors.New("not tried")

// publish publishes rows (but the bad ones) in order, and returns each
// one's outcome. One at a time (the default), it stops at the first
// failure that is not the row's own (the broker away), leaving the rest
// errNotTried, so that order holds; with more in flight (InFlight), it
// publishes them all, at most that many at once.
func (r *relay) publish(ctx context.Context, rows []outboxstore.Row, bad map[int64]error) []error {
	results := make([]error, len(rows))
	for i := range results {
		results[i] = errNotTried
	}
	window := make(chan struct{}, max(r.o.cfg.inFlight, 1))
	var wg sync.WaitGroup
	for i, row := range rows {
		if bad[row.Seq] != nil {
			continue
		}
		if time.Now().After(r.until) {
			break
		}
		if r.o.cfg.inFlight <= 1 {
			_, err := r.m.Emit(r.emitContext(ctx, row), row.Type, row.Body, emitOptions(row)...)
			results[i] = err
			if err != nil && !errors.Is(err, sdk.ErrInvalid) && !errors.Is(err, sdk.ErrForbidden) || errors.Is(err, wire.ErrNotStarted) {
				break
			}
			continue
		}
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		err := r.m.EmitAsync(r.emitContext(ctx, row), row.Type, row.Body, func(_ string, err error) {
			results[i] = err
			<-window
			wg.Done()
		}, emitOptions(row)...)
		if err != nil {
			results[i] = err
			<-window
			wg.Done()
			break
		}
	}
	wg.Wait()
	return results
}

// emitContext carries the row's cause to the host.
func (r *relay) emitContext(ctx context.Context, row outboxstore.Row) context.Context {
	if row.Options.Cause != "" {
		return causation.With(ctx, row.Options.Cause)
	}
	return ctx
}

// emitOptions are the sdk options that publish row as it was written.
func emitOptions(row outboxstore.Row) []sdk.EmitOption {
	opts := []sdk.EmitOption{sdk.AsFullType(),
		wire.OutboxOption(causation.OutboxRef{Scope: row.Options.Scope, N: row.Options.N, Time: time.UnixMilli(row.Options.IDUnixMillis)}).(sdk.EmitOption)}
	if row.Options.Schema != "" {
		opts = append(opts, sdk.WithSchema(row.Options.Schema))
	}
	if row.Options.TTLMillis > 0 {
		opts = append(opts, sdk.WithTTL(time.Duration(row.Options.TTLMillis)*time.Millisecond))
	}
	if row.Options.Priority != nil {
		opts = append(opts, sdk.WithPriority(*row.Options.Priority))
	}
	if row.Options.AtUnixMillis > 0 {
		opts = append(opts, sdk.At(time.UnixMilli(row.Options.AtUnixMillis)))
	}
	return opts
}

func (r *relay) setAside(ctx context.Context, row outboxstore.Row, why error) {
	r.log.Error("outbox relay: row refused by the mesh, set aside (it stays in mesh_outbox with its reason)", "id", row.ID, "event_type", row.Type, "err", why)
	if err := r.o.store.MarkFailed(ctx, row.Seq, why.Error()); err != nil {
		r.log.Warn("outbox relay: could not set the row aside", "id", row.ID, "err", err)
	}
}

// prune deletes the rows sent before the retention, about once a minute.
func (r *relay) prune(ctx context.Context) {
	now := time.Now()
	if now.Sub(r.pruned) < pruneEvery {
		return
	}
	r.pruned = now
	if n, err := r.o.store.Prune(ctx, now.Add(-r.o.cfg.retention)); err != nil {
		r.log.Warn("outbox relay: prune", "err", err)
	} else if n > 0 {
		r.log.Debug("outbox relay: pruned sent rows", "rows", n)
	}
}
