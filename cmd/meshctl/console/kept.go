package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
// queue: they stay in it). The page keeps of each its summary
// (deadletters.Summaries): under 1 KiB, at most 8 KiB, whatever its body.
const keptLimit = 10000

// messageBodyShown is how much of a message's body its page shows; the
// whole body is a download (keptBody).
const messageBodyShown = 64 << 10

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
	// Read is when the queue was read: pages that ask within keptFresh
	// of it are shown the same read.
	Read time.Time
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

// keptList reads the summaries of a keeper queue's messages, up to
// keptLimit, or is given a read of them that is running or fresh.
func (s *Server) keptList(r *http.Request, k keeper) ([]deadletters.Message, time.Time, error) {
	ctx, cancel := ask(r)
	defer cancel()
	return s.kept.get(ctx, k.Queue, KeptQuery{Limit: keptLimit, Summaries: true})
}

// keptFailed renders the page of a read that failed: 503 with
// Retry-After when it may be asked again in a moment (the reads are
// busy, a replay or purge of the queue runs, the read goes on), 502
// otherwise.
func (s *Server) keptFailed(w http.ResponseWriter, r *http.Request, k keeper, err error) {
	status := http.StatusBadGateway
	if errors.Is(err, errBrowsesBusy) || errors.Is(err, errActing) || errors.Is(err, errStillRead) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "5")
	}
	s.fail(w, r, status, k.Title, err.Error())
}

func (s *Server) keptGroups(w http.ResponseWriter, r *http.Request, k keeper) {
	v := view{Title: k.Title, Nav: k.Path}
	msgs, at, err := s.keptList(r, k)
	if err != nil {
		s.keptFailed(w, r, k, err)
		return
	}
	v.Data = keptView{Keeper: k, Groups: groupsOf(k, msgs), Total: len(msgs), Limited: len(msgs) == keptLimit, Read: at}
	s.render(w, r, "kept", v)
}

func (s *Server) keptGroup(w http.ResponseWriter, r *http.Request, k keeper) {
	v := view{Title: k.Title, Nav: k.Path}
	msgs, at, err := s.keptList(r, k)
	if err != nil {
		s.keptFailed(w, r, k, err)
		return
	}
	for _, g := range groupsOf(k, msgs) {
		if g.Key == r.PathValue("group") {
			v.Data = keptView{Keeper: k, Group: g, Total: len(msgs), Read: at}
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
	// Body is the part of the body shown: all of it, or its first
	// messageBodyShown bytes (Cut), up to a whole character.
	Body []byte
	Cut  bool
	// Download is the whole body's link.
	Download string
}

func (s *Server) keptMessage(w http.ResponseWriter, r *http.Request, k keeper) {
	id := r.PathValue("id")
	ctx, cancel := ask(r)
	defer cancel()
	msgs, _, err := s.kept.get(ctx, k.Queue, KeptQuery{Filter: deadletters.Filter{IDs: []string{id}}, Limit: 1, Body: messageBodyShown})
	if err != nil {
		s.keptFailed(w, r, k, err)
		return
	}
	if len(msgs) == 0 {
		s.fail(w, r, http.StatusNotFound, k.Title, fmt.Sprintf("no %s %s in %s", k.One, id, k.Queue))
		return
	}
	m := msgs[0]
	d := keptMessageView{Keeper: k, Message: m, Event: eventLink(m.ID), Body: m.Body, Cut: m.Size > len(m.Body),
		Download: "/" + k.Path + "/message/" + url.PathEscape(id) + "/body"}
	if d.Cut {
		d.Body = wholeRunes(d.Body)
	}
	for name, val := range m.Headers {
		d.Headers = append(d.Headers, header{name, deadletters.HeaderText(val)})
	}
	sort.Slice(d.Headers, func(i, j int) bool { return d.Headers[i].Name < d.Headers[j].Name })
	s.render(w, r, "message", view{Title: k.One + " " + id, Nav: k.Path, Data: d})
}

// wholeRunes is b without the bytes of a character cut at its end.
func wholeRunes(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// keptBody sends one kept message's whole body, as a download of bytes
// (never as a page: it is anyone's who can publish). It is read for this
// request alone.
func (s *Server) keptBody(w http.ResponseWriter, r *http.Request, k keeper) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), keptReadTimeout) // a download may take a while
	defer cancel()
	msgs, err := s.kept.getOwn(ctx, k.Queue, KeptQuery{Filter: deadletters.Filter{IDs: []string{id}}, Limit: 1})
	if err != nil {
		s.keptFailed(w, r, k, err)
		return
	}
	if len(msgs) == 0 {
		s.fail(w, r, http.StatusNotFound, k.Title, fmt.Sprintf("no %s %s in %s", k.One, id, k.Queue))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fileName(id) + ".body"}))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(msgs[0].Body)))
	_, _ = w.Write(msgs[0].Body)
}

// fileName is id as a file's name: its letters, digits, '.', '-' and '_'
// (others as '_'), at most 100.
func fileName(id string) string {
	b := []byte(id)
	if len(b) > 100 {
		b = b[:100]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] == '.' {
		return "message"
	}
	return string(b)
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
		// Its turn: no page reads the queue meanwhile (it would hold
		// messages this replay or purge would miss), nor does another
		// replay or purge of it run.
		endTurn, err := s.kept.act(ctx, k.Queue, func() {
			s.jobs.update(jb, func(j *job) {
				j.Waiting = "for the pages reading " + k.Queue + ", or another replay or purge of it, to end"
			})
		})
		if err == nil {
			s.jobs.update(jb, func(j *job) { j.Waiting = "" })
			if action == "replay" {
				res, err = s.cfg.Mesh.Replay(ctx, k.Queue, f, progress)
			} else {
				res, err = s.cfg.Mesh.Purge(ctx, k.Queue, f, progress)
			}
			endTurn()
		}
		summary := summaryOf(k, action, res)
		if missing := len(ids) - res.Matched; missing > 0 {
			summary += fmt.Sprintf("; %d of the %d asked for not found (replayed or purged since the page was drawn, perhaps by another meshctl)", missing, len(ids))
		}
		a.Result = summary
		if err != nil {
			a.Result += "; failed: " + err.Error()
		}
		// Recorded before the job says it is finished: what the page
		// shows done is in the log.
		s.record(r, a)
		s.jobs.update(jb, func(j *job) {
			j.Finished, j.Summary, j.Done, j.Waiting = true, summary, res.Matched, ""
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
