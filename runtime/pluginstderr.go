package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
)

// A module process that exits while it starts (a database it cannot
// write, a bad setting) says why on its stderr, before any handshake;
// go-plugin logs such lines at debug, and its own error ("Unrecognized
// remote plugin message...", "plugin exited before we could connect")
// names a cause that is rarely the one. The host keeps the last lines of
// each process's stderr (stderrTail) and, when the process went away while
// starting, reports them with its exit status as the start's error
// (startError): in the log at error, in /readyz and in the module's failure
// event under meshd run, and in meshd config check's report (DescribeModule).

const (
	tailLines    = 8   // lines of stderr kept
	tailLineText = 400 // bytes kept of each
)

// stderrTail keeps the last tailLines lines a process wrote to stderr.
// go-plugin writes each line, then its newline, to it.
type stderrTail struct {
	mu    sync.Mutex
	lines []string
	cur   strings.Builder
}

func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range p {
		if b == '\n' {
			t.flush()
			continue
		}
		if t.cur.Len() < tailLineText {
			t.cur.WriteByte(b)
		}
	}
	return len(p), nil
}

// flush ends the current line. t.mu is held.
func (t *stderrTail) flush() {
	line := strings.TrimSpace(t.cur.String())
	t.cur.Reset()
	if line == "" {
		return
	}
	if len(t.lines) == tailLines {
		t.lines = append(t.lines[:0], t.lines[1:]...)
	}
	t.lines = append(t.lines, readableLine(line))
}

// readableLine is a stderr line as an operator reads it: an hclog JSON
// line (what the sdk logs) as its level and message, any other as it is,
// cut and with control characters made visible.
func readableLine(line string) string {
	var entry struct {
		Level   string `json:"@level"`
		Message string `json:"@message"`
		Err     any    `json:"err"`
	}
	if json.Unmarshal([]byte(line), &entry) == nil && entry.Message != "" {
		line = entry.Level + ": " + entry.Message
		if entry.Err != nil {
			line += fmt.Sprintf(": %v", entry.Err)
		}
	}
	return cutText(strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, line), tailLineText)
}

// String is the lines kept, joined by " | ".
func (t *stderrTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := t.lines
	if s := strings.TrimSpace(t.cur.String()); s != "" {
		lines = append(lines[:len(lines):len(lines)], readableLine(s))
	}
	return strings.Join(lines, " | ")
}

// startError is the error of a start whose client.Client() returned err,
// the process's stderr kept in tail: a protocol refusal as such; else, if
// the process went away, its own last words in place of go-plugin's (which
// are about the handshake it never made: "Unrecognized remote plugin
// message ... not compiled for this architecture"); else err with what it
// said so far.
func startError(client *goplugin.Client, cmd *exec.Cmd, tail *stderrTail, err error) error {
	if verr := versionError(err); verr != err {
		return verr
	}
	words := lastWords(client, cmd, tail)
	switch {
	case words != "" && client.Exited():
		return errors.New(words)
	case words != "":
		return fmt.Errorf("%s (%w)", words, err)
	}
	return err
}

// exitWait bounds how long a start's failure waits for go-plugin to see
// its process exit (it reads the rest of stderr first).
const exitWait = 2 * time.Second

// lastWords is what a process that went away while starting left: its
// exit status and the end of its stderr, as a clause for the start's
// error; "" if it left nothing to say.
func lastWords(client *goplugin.Client, cmd *exec.Cmd, tail *stderrTail) string {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(exitWait); !client.Exited() && time.Now().Before(deadline); {
		<-tick.C // go-plugin offers no channel for its process's exit
	}
	var parts []string
	if client.Exited() && cmd.ProcessState != nil { // set by go-plugin's Wait before Exited holds
		parts = append(parts, "it exited with "+cmd.ProcessState.String())
	}
	if s := tail.String(); s != "" {
		parts = append(parts, "its stderr ended with: "+s)
	}
	return strings.Join(parts, "; ")
}
