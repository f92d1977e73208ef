package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
)

// benchOutbox measures, in alternating rounds on the first queue type,
// plain emits beside emits through the outbox (sdk/outbox) on SQLite: the
// same concurrent producers, each writing a row of its own table and the
// event in one transaction; throughput runs from the first write to the
// last handling, so it includes the relay. Then the latency of each at
// o.rate events per second, and the client's CPU per event.
func benchOutbox(url string, o options) error {
	qt := strings.Split(o.queueTypes, ",")[0]
	fmt.Printf("\n== outbox (%s queues, SQLite, %d producers, one transaction per event) ==\n", qt, o.meshPublishers)
	o.publishers = o.meshPublishers
	names := []string{"emit", "commit+emit", "outbox", "outbox-64"}
	mk := map[string]func(*sink) (side, error){
		"emit":        func(s *sink) (side, error) { return newMeshOf(url, qt, s, nil, nil, runtime.ModuleConfig{}) },
		"commit+emit": func(s *sink) (side, error) { return newOutboxSide(url, qt, s, true) },
		"outbox":      func(s *sink) (side, error) { return newOutboxSide(url, qt, s, false) },
		"outbox-64":   func(s *sink) (side, error) { return newOutboxSide(url, qt, s, false, outbox.InFlight(64)) },
	}
	tput, cpu, p50 := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for r := 0; r < o.rounds; r++ {
		for _, name := range names {
			tp, c, err := throughput(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s throughput: %w", name, err)
			}
			l50, l99, err := latency(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s latency: %w", name, err)
			}
			us := float64(c) / float64(time.Microsecond)
			tput[name], cpu[name], p50[name] = append(tput[name], tp), append(cpu[name], us), append(p50[name], l50)
			fmt.Printf("round %d %-9s %8.0f events/s  client CPU %5.1f µs/event   p50 %6.2f ms   p99 %6.2f ms\n", r+1, name, tp, us, l50, l99)
		}
	}
	for _, name := range names[1:] {
		fmt.Printf("%s/emit: throughput %.2f, client CPU %.2f (+%.1f µs/event), p50 latency +%.2f ms\n", name,
			pairedRatio(tput[name], tput["emit"]), pairedRatio(cpu[name], cpu["emit"]), median(cpu[name])-median(cpu["emit"]),
			median(p50[name])-median(p50["emit"]))
	}
	if err := benchInbox(url, qt, o); err != nil {
		return err
	}
	record("outbox on SQLite, 64 in flight / commit, then emit (no outbox)", pairedRatio(tput["outbox-64"], tput["commit+emit"]), 0.5, true, "")
	record("outbox on SQLite, in commit order (write, commit, relay) / plain emit, throughput", pairedRatio(tput["outbox"], tput["emit"]), 0.5, true, "")
	record("outbox on SQLite, 64 in flight / plain emit, throughput", pairedRatio(tput["outbox-64"], tput["emit"]), 0.5, true, "")
	return nil
}

// outboxSide is the mesh side whose module writes each event to its
// outbox on SQLite, in a transaction with a row of its own table, and
// relays it (or, plain, commits and then emits).
type outboxSide struct {
	*meshSide
	db     *sql.DB
	ob     *outbox.Outbox
	dir    string
	cancel context.CancelFunc
	relay  chan error
	plain  bool
}

// newOutboxSide is the side whose module writes each event to its outbox
// or, plain, the pattern the outbox replaces: the same transaction,
// committed, then a plain Emit (lost if the process dies between the two).
func newOutboxSide(url, qt string, s *sink, plain bool, opts ...outbox.Option) (side, error) {
	sd, err := newMeshOf(url, qt, s, nil, nil, runtime.ModuleConfig{})
	if err != nil {
		return nil, err
	}
	ms := sd.(*meshSide)
	dir, err := os.MkdirTemp("", "meshbench-outbox-")
	if err != nil {
		ms.close()
		return nil, err
	}
	o := &outboxSide{meshSide: ms, dir: dir, relay: make(chan error, 1), plain: plain}
	fail := func(err error) (side, error) {
		o.closeDB()
		ms.close()
		return nil, err
	}
	if o.db, err = outbox.OpenSQLite(filepath.Join(dir, "bench.db")); err != nil {
		return fail(err)
	}
	if _, err := o.db.Exec(`CREATE TABLE orders (seq INTEGER PRIMARY KEY)`); err != nil {
		return fail(err)
	}
	if o.ob, err = outbox.New(context.Background(), o.db, sdk.Module{Name: ms.name, Emits: []string{"measured"}}, opts...); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	go func() { o.relay <- o.ob.Relay(ctx, ms.mod.Mesh()) }()
	return o, nil
}

func (o *outboxSide) publish(ctx context.Context, seq int) error {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (seq) VALUES (?)`, seq); err != nil {
		return err
	}
	if o.plain {
		if err := tx.Commit(); err != nil {
			return err
		}
		_, err := o.mod.Mesh().Emit(ctx, "measured", json.RawMessage(body(seq)))
		return err
	}
	if _, err := o.ob.Emit(ctx, tx, "measured", json.RawMessage(body(seq))); err != nil {
		return err
	}
	return tx.Commit()
}

func (o *outboxSide) closeDB() {
	if o.db != nil {
		o.db.Close()
	}
	os.RemoveAll(o.dir)
}

func (o *outboxSide) close() error {
	o.cancel()
	err := <-o.relay
	o.closeDB()
	return errors.Join(err, o.meshSide.close())
}

// benchInbox measures a handler that applies its effect through the inbox
// on SQLite (a transaction recording the event's id, the effect's row,
// the commit, then the acknowledgement) beside a plain handler, in
// alternating rounds: throughput and the latency at o.rate events per
// second, from emit to the end of the handling.
func benchInbox(url, qt string, o options) error {
	fmt.Printf("\n== inbox (%s queues, SQLite, a transaction per handled event) ==\n", qt)
	names := []string{"plain", "inbox"}
	mk := map[string]func(*sink) (side, error){
		"plain": func(s *sink) (side, error) { return newMeshOf(url, qt, s, nil, nil, runtime.ModuleConfig{}) },
		"inbox": func(s *sink) (side, error) { return newInboxSide(url, qt, s) },
	}
	tput, p50 := map[string][]float64{}, map[string][]float64{}
	for r := 0; r < o.rounds; r++ {
		for _, name := range names {
			tp, c, err := throughput(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s throughput: %w", name, err)
			}
			l50, l99, err := latency(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s latency: %w", name, err)
			}
			tput[name], p50[name] = append(tput[name], tp), append(p50[name], l50)
			fmt.Printf("round %d %-6s %8.0f events/s  client CPU %5.1f µs/event   p50 %6.2f ms   p99 %6.2f ms\n", r+1, name, tp, float64(c)/float64(time.Microsecond), l50, l99)
		}
	}
	added := median(p50["inbox"]) - median(p50["plain"])
	fmt.Printf("inbox/plain: throughput %.2f, p50 latency +%.2f ms\n", pairedRatio(tput["inbox"], tput["plain"]), added)
	record("inbox on SQLite: added p50 latency at "+fmt.Sprint(o.rate)+"/s", added, 2, false, " ms")
	return nil
}

// inboxSide is the mesh side whose module handles each event through the
// inbox on SQLite, writing a row of its own in the same transaction.
type inboxSide struct {
	*meshSide
	db  *sql.DB
	dir string
}

func newInboxSide(url, qt string, s *sink) (side, error) {
	dir, err := os.MkdirTemp("", "meshbench-inbox-")
	if err != nil {
		return nil, err
	}
	db, err := outbox.OpenSQLite(filepath.Join(dir, "bench.db"))
	if err == nil {
		_, err = db.Exec(`CREATE TABLE seen (id TEXT PRIMARY KEY)`)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	sd, err := newMeshHandling(url, qt, s, nil, nil, runtime.ModuleConfig{}, func(name string, h sdk.Handler) (sdk.Handler, error) {
		ob, err := outbox.New(context.Background(), db, sdk.Module{Name: name, Emits: []string{"measured"}})
		if err != nil {
			return nil, err
		}
		in := ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO seen (id) VALUES (?)`, ev.ID)
			return err
		})
		return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if err := in.HandleEvent(ctx, ev); err != nil {
				return err
			}
			return h.HandleEvent(ctx, ev) // measured once the effect committed
		}), nil
	})
	if err != nil {
		db.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	return &inboxSide{meshSide: sd.(*meshSide), db: db, dir: dir}, nil
}

func (i *inboxSide) close() error {
	err := i.meshSide.close()
	i.db.Close()
	os.RemoveAll(i.dir)
	return err
}
