package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// keeper is one of the two keeper queues, as the pages name it.
type keeper struct {
	Queue    string // wire.QueueDead or wire.QueueUnrouted
	Path     string // "dlq" or "unrouted"
	Dead     bool
	One, Few string
	Title    string
}

var (
	deadKeeper     = keeper{Queue: wire.QueueDead, Path: "dlq", Dead: true, One: "dead letter", Few: "dead letters", Title: "Dead letters"}
	unroutedKeeper = keeper{Queue: wire.QueueUnrouted, Path: "unrouted", One: "unrouted event", Few: "unrouted events", Title: "Unrouted events"}
)

// keptLimit bounds the messages a keeper page reads (a browse of the
// queue: they stay in it).
const keptLimit = 10000

// group is the kept messages that share a queue, a reason and an error
// (dead letters), or a type and a source (unrouted events).
type group struct {
	Key           string // stable id, for the URL
	Queue, Reason string // dead letters
	Error         string
	Type, Source  string // unrouted events
	Count         int
	First, Last   time.Time
	Messages      []deadletters.Message
	IDs           []string
}

// keptView is a keeper page's data.
type keptView struct {
	Keeper  keeper
	Groups  []*group
	Group   *group
	Total   int
	Limited bool
}

// groupsOf groups msgs, the most recently active group first.
func groupsOf(k keeper, msgs []deadletters.Message) []*group {
	byKey := map[string]*group{}
	var out []*group
	for _, m := range msgs {
		var parts []string
		if k.Dead {
			parts = []string{m.Queue, m.Reason, m.Error}
		} else {
			parts = []string{m.Type, m.Source}
		}
		sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
		key := hex.EncodeToString(sum[:6])
		g, ok := byKey[key]
		if !ok {
			g = &group{Key: key}
			if k.Dead {
				g.Queue, g.Reason, g.Error = m.Queue, m.Reason, m.Error
			} else {
				g.Type, g.Source = m.Type, m.Source
			}
			byKey[key] = g
			out = append(out, g)
		}
		g.Count++
		g.Messages = append(g.Messages, m)
		g.IDs = append(g.IDs, m.ID)
		if !m.Time.IsZero() && (g.First.IsZero() || m.Time.Before(g.First)) {
			g.First = m.Time
		}
		if m.Time.After(g.Last) {
			g.Last = m.Time
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Last.After(out[j].Last) })
	return out
}

func (s *Server) keptList(r *http.Request, k keeper) ([]deadletters.Message, error) {
	ctx, cancel := ask(r)
	defer cancel()
	return s.cfg.Mesh.Kept(ctx, k.Queue, deadletters.Filter{}, keptLimit)
}

func (s *Server) keptGroups(w http.ResponseWriter, r *http.Request, k keeper) {
	v := view{Title: k.Title, Nav: k.Path}
	msgs, err := s.keptList(r, k)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, k.Title, err.Error())
		return
	}
	v.Data = keptView{Keeper: k, Groups: groupsOf(k, msgs), Total: len(msgs), Limited: len(msgs) == keptLimit}
	s.render(w, r, "kept", v)
}

func (s *Server) keptGroup(w http.ResponseWriter, r *http.Request, k keeper) {
	v := view{Title: k.Title, Nav: k.Path}
	msgs, err := s.keptList(r, k)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, k.Title, err.Error())
		return
	}
	for _, g := range groupsOf(k, msgs) {
		if g.Key == r.PathValue("group") {
			v.Data = keptView{Keeper: k, Group: g, Total: len(msgs)}
			s.render(w, r, "group", v)
			return
		}
	}
	s.fail(w, r, http.StatusNotFound, k.Title, "no such group (any more): its "+k.Few+" were replayed or purged, or their reason changed")
}

// keptMessageView is one kept message's page data.
type keptMessageView struct {
	Keeper  keeper
	Message deadletters.Message
	Headers []header
	Event   string // its page in the audit log
}

func (s *Server) keptMessage(w http.ResponseWriter, r *http.Request, k keeper) {
	id := r.PathValue("id")
	ctx, cancel := ask(r)
	defer cancel()
	msgs, err := s.cfg.Mesh.Kept(ctx, k.Queue, deadletters.Filter{IDs: []string{id}}, 1)
	if err != nil {
		s.fail(w, r, http.StatusBadGateway, k.Title, err.Error())
		return
	}
	if len(msgs) == 0 {
		s.fail(w, r, http.StatusNotFound, k.Title, fmt.Sprintf("no %s %s in %s", k.One, id, k.Queue))
		return
	}
	m := msgs[0]
	d := keptMessageView{Keeper: k, Message: m, Event: eventLink(m.ID)}
	for name, val := range m.Headers {
		d.Headers = append(d.Headers, header{name, deadletters.HeaderText(val)})
	}
	sort.Slice(d.Headers, func(i, j int) bool { return d.Headers[i].Name < d.Headers[j].Name })
	s.render(w, r, "message", view{Title: k.One + " " + id, Nav: k.Path, Data: d})
}

// keptRequest is the body of a replay or a purge: the ids of the
// messages to act on (a group's, or a selection). The console never acts
// on a whole queue by implication.
type keptRequest struct {
	IDs []string `json:"ids"`
	// Queue is, for dead letters, the queue that gave up on them (the
	// group's): an event another queue dead-lettered too is left alone.
	Queue string `json:"queue,omitempty"`
}

// maxActIDs bounds the ids of one action.
const maxActIDs = keptLimit

// keptAct starts a replay or a purge of the ids in the body and answers
// with its job, which /api/jobs/ID reports on.
func (s *Server) keptAct(w http.ResponseWriter, r *http.Request, k keeper, action string) {
	if !s.checkAction(w, r) {
		return
	}
	var req keptRequest
	if err := readJSON(w, r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	ids := slices.Compact(slices.Sorted(slices.Values(nonEmpty(req.IDs))))
	if len(ids) == 0 || len(ids) > maxActIDs {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("want between 1 and %d ids of %s", maxActIDs, k.Few))
		return
	}
	if k.Dead && req.Queue == "" {
		writeJSONError(w, http.StatusBadRequest, "want the queue that gave up on the dead letters (queue)")
		return
	}
	f := deadletters.Filter{IDs: ids, Queue: req.Queue}
	if err := f.Validate(); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	jb := s.jobs.start(action)
	if jb == nil {
		writeJSONError(w, http.StatusTooManyRequests, fmt.Sprintf("%d replays or purges are running: wait for one to end", maxRunning))
		return
	}
	s.jobs.update(jb, func(j *job) { j.Total = len(ids) })
	a := Action{Action: action, Target: k.Queue, IDs: len(ids)}
	// The work outlives the request: it goes on when the page is left,
	// bounded by the same time as a long replay from the command line.
	s.working.Add(1)
	go func() {
		defer s.working.Done()
		ctx, cancel := context.WithTimeout(s.work, 30*time.Minute)
		defer cancel()
		progress := func(done, total int) { s.jobs.update(jb, func(j *job) { j.Done, j.Total = done, total }) }
		var res deadletters.Result
		var err error
		if action == "replay" {
			res, err = s.cfg.Mesh.Replay(ctx, k.Queue, f, progress)
		} else {
			res, err = s.cfg.Mesh.Purge(ctx, k.Queue, f, progress)
		}
		summary := summaryOf(k, action, res)
		if missing := len(ids) - res.Matched; missing > 0 {
			summary += fmt.Sprintf("; %d of the %d asked for not found (replayed, purged or taken since the page was drawn)", missing, len(ids))
		}
		a.Result = summary
		if err != nil {
			a.Result += "; failed: " + err.Error()
		}
		// Recorded before the job says it is finished: what the page
		// shows done is in the log.
		s.record(r, a)
		s.jobs.update(jb, func(j *job) {
			j.Finished, j.Summary, j.Done = true, summary, res.Matched
			j.Missing = len(ids) - res.Matched
			for _, l := range res.Left {
				j.Left = append(j.Left, l.ID+": "+l.Err.Error())
			}
			if err != nil {
				j.Error = err.Error()
			}
		})
	}()
	writeJSON(w, http.StatusAccepted, map[string]string{"job": jb.ID})
}

// summaryOf says what a replay or a purge did.
func summaryOf(k keeper, action string, res deadletters.Result) string {
	if action == "purge" {
		return fmt.Sprintf("purged %d of %d %s", res.Done, res.Matched, k.Few)
	}
	s := fmt.Sprintf("replayed %d of %d %s", res.Done, res.Matched, k.Few)
	if len(res.Left) > 0 {
		s += fmt.Sprintf("; %d left in %s", len(res.Left), k.Queue)
	}
	if res.CameBack > 0 {
		s += fmt.Sprintf("; %d came back unrouted", res.CameBack)
	}
	return s
}
