//go:build soak

package soak

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite"
)

// run is one line of the module processes' history: a handling, a tool
// run or a consumed message, by which process and when.
type run struct {
	pid int
	at  int64
}

// history is what every part of the workload saw, for the checker: the
// test's own (emits, the sink) in memory, the module processes' read from
// their history file at the end.
type history struct {
	mu        sync.Mutex
	confirmed map[string]string          // order id → event id, for emits that returned nil (confirmed or spooled)
	refused   map[string]int             // emit errors, by kind
	done      map[string]int             // done events the sink handled, by order id
	doneIDs   map[string]bool            // their event ids
	booked    map[string]map[string]bool // the ledger's booked events the sink handled: order id → event ids
	legacyIn  map[string]bool            // messages published to the consumed queue and confirmed
	jobsIn    map[string]bool            // messages published to the dispatcher's queue and confirmed
	// interrupted is when the nemesis SIGKILLed or SIGSTOPped a module
	// process, by pid (the module processes of a killed meshd included).
	interrupted map[int][]int64

	// From the module processes' history file.
	handled      map[string][]run // by node/order id
	taxed        map[string][]run // by caller node/request id
	legacy       map[string][]run // by message id
	stamped      map[string][]run // the agent's tool runs, by the job's message id (the agent's pid)
	stampedCalls map[string][]run // the same, by the call's request id
}

func newHistory() *history {
	return &history{confirmed: map[string]string{}, refused: map[string]int{}, done: map[string]int{}, doneIDs: map[string]bool{}, booked: map[string]map[string]bool{},
		legacyIn: map[string]bool{}, jobsIn: map[string]bool{}, interrupted: map[int][]int64{},
		handled: map[string][]run{}, taxed: map[string][]run{}, legacy: map[string][]run{}, stamped: map[string][]run{}, stampedCalls: map[string][]run{}}
}

// interrupt records that the nemesis killed or stopped pids at.
func (h *history) interrupt(at int64, pids ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range pids {
		h.interrupted[p] = append(h.interrupted[p], at)
	}
}

// parse adds lines of the module processes' history file (h.mu held).
func (h *history) parse(text string) error {
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 5 {
			return fmt.Errorf("history line %q: want KIND NODE KEY PID TIME", line)
		}
		pid, err1 := strconv.Atoi(fs[3])
		at, err2 := strconv.ParseInt(fs[4], 10, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("history line %q: bad pid or time", line)
		}
		r := run{pid: pid, at: at}
		switch fs[0] {
		case "handled":
			h.handled[fs[1]+"/"+fs[2]] = append(h.handled[fs[1]+"/"+fs[2]], r)
		case "taxed":
			h.taxed[fs[2]] = append(h.taxed[fs[2]], r)
		case "legacy":
			h.legacy[fs[2]] = append(h.legacy[fs[2]], r)
		case "stamped":
			job, call, _ := strings.Cut(fs[2], "/")
			h.stamped[job] = append(h.stamped[job], r)
			h.stampedCalls[call] = append(h.stampedCalls[call], r)
		default:
			return fmt.Errorf("history line %q: no kind %s", line, fs[0])
		}
	}
	return nil
}

// repeats counts, of keys run more than once, those the nemesis explains
// (every run after the first follows an interruption of the process that
// ran the one before it: a SIGKILL, its meshd's SIGKILL, or a SIGSTOP past
// the handler's timeout) and those it does not: at-least-once allows the
// first, the de-duplication promise forbids the second.
func (h *history) repeats(runs map[string][]run) (explained, unexplained int, examples []string) {
	for key, rs := range runs {
		if len(rs) < 2 {
			continue
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].at < rs[j].at })
		ok := true
		for i := 1; i < len(rs); i++ {
			if !h.interruptedBetween(rs[i-1].pid, rs[i-1].at-int64(interruptWindow), rs[i].at) {
				ok = false
			}
		}
		if ok {
			explained++
			continue
		}
		unexplained++
		if len(examples) < 5 {
			examples = append(examples, fmt.Sprintf("%s %v", key, rs))
		}
	}
	return explained, unexplained, examples
}

// interruptWindow is how long before a run an interruption of its process
// can still explain that the run is repeated: a stop (at most 8 s) and
// the handler's time before it wrote its line, or an orphan's last second
// after its meshd was killed.
const interruptWindow = 20 * time.Second

// interruptedBetween: was pid killed or stopped between from and to? A
// run written by a process killed just after, before its outcome reached
// meshd, is run again; so is one written after a stop past the handler's
// timeout, or by an orphan whose meshd is already gone. Pid 0 is a run
// whose process was gone when it began (a tool the agent's orphaned
// supervisor ran): interrupted by definition.
func (h *history) interruptedBetween(pid int, from, to int64) bool {
	if pid == 0 {
		return true
	}
	for _, t := range h.interrupted[pid] {
		if from < t && t < to {
			return true
		}
	}
	return false
}

// audit is what the audit logger's database holds, checked against the
// emits and the sink.
type audit struct{ missing, doubled int }

func readAudit(path string, h *history) (audit, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return audit{}, err
	}
	defer db.Close()
	ids := map[string]bool{}
	perOrder := map[string]int{}
	rows, err := db.Query(`SELECT id, type, COALESCE(body_json, '') FROM events WHERE type IN ('module.shop.order', 'module.worker.done')`)
	if err != nil {
		return audit{}, fmt.Errorf("query %s: %w", path, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, typ, body string
		if err := rows.Scan(&id, &typ, &body); err != nil {
			return audit{}, err
		}
		ids[id] = true
		var o order
		_ = json.Unmarshal([]byte(body), &o)
		perOrder[typ+"/"+o.ID]++
	}
	if err := rows.Err(); err != nil {
		return audit{}, err
	}
	var a audit
	h.mu.Lock() // the sink may still take a late duplicate
	defer h.mu.Unlock()
	for _, id := range h.confirmed {
		if !ids[id] {
			a.missing++
		}
	}
	for id := range h.doneIDs {
		if !ids[id] {
			a.missing++
		}
	}
	for _, n := range perOrder {
		if n > 1 {
			a.doubled++ // one order as two events of one type: an emit or a handling that doubled
		}
	}
	return a, nil
}
