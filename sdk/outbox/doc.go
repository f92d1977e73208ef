// Package outbox lets a module change its own database and emit events in
// one transaction: the transactional outbox (docs/adr/0044). An event
// written with Emit in the caller's *sql.Tx exists if and only if the
// transaction commits; the relay (Relay, run from the module's Run)
// publishes committed events through the mesh in commit order, with the
// broker's confirm, and marks them sent. Nothing is lost between the
// commit and the publish (the row waits in the database through any
// crash), and nothing of a rolled-back change is ever published.
//
//	db, _ := outbox.OpenSQLite(filepath.Join(process.Dir(), "ledger.db"))
//	ob, _ := outbox.New(ctx, db, module)
//	module.Run = ob.Relay
//
//	tx, _ := db.BeginTx(ctx, nil)
//	tx.ExecContext(ctx, `INSERT INTO orders ...`)
//	id, err := ob.Emit(ctx, tx, "order.booked", order)
//	tx.Commit()
//
// Ids are the mesh's, as ever: an event's id is fixed when its row is
// written, derived from the module's name and the row (inside a handler,
// from the handled event, so a handling run again writes the same ids),
// and the node derives it again when the row is published, so a module
// can only use ids of its own and a row published twice after a crash
// carries the same id both times; consumers absorb the repeat.
//
// Databases: SQLite (modernc.org/sqlite, OpenSQLite) and PostgreSQL
// (pgx's database/sql driver, github.com/jackc/pgx/v5/stdlib). New makes
// the tables (mesh_outbox, mesh_outbox_meta, mesh_outbox_relay,
// mesh_inbox) and refuses tables of a newer format. On PostgreSQL several
// processes may share the database: one relay at a time holds the outbox.
//
// Under meshd, the outbox needs module protocol 8 (meshd v0.2.0 or later):
// an older meshd refuses the module binary at load.
package outbox
