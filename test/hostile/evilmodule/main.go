// Command evilmodule is a hostile module process for the trust-boundary
// tests (test/hostile): it speaks the plugin protocol directly, not
// through sdk/process, so it can send what the sdk would never let a
// module send, and reports what each attack got to the test.
//
// Its settings (MESH_MODULE_SETTINGS) say what to do:
//
//	{"attack": "name", "report": "/tmp/x/report.sock", ...}
//
// "report" is the test's unix socket; each report is a JSON line
// {"attack": ..., "step": ..., "got": ..., "err": ...} written to it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
)

type settings struct {
	Attack string `json:"attack"`
	Report string `json:"report"`
	// Name is the module name the process claims in Describe.
	Name string `json:"name"`
	// Queue, Tool, ID, Pattern are the attack's target.
	Queue   string `json:"queue"`
	Tool    string `json:"tool"`
	ID      string `json:"id"`
	Pattern string `json:"pattern"`
	// Size is the size in bytes of what the attack sends.
	Size int `json:"size"`
	// Filters are the filters it describes for Pattern, and Filter
	// for Queue.
	Filters []string `json:"filters"`
	Filter  string   `json:"filter"`
	// Schemas are what the "schemas" attack declares (event, version,
	// schema), Schema repeated Size times when Size is set; Reads the
	// versions it says Pattern's handler reads.
	Schemas []struct {
		Event   string          `json:"event"`
		Version string          `json:"version"`
		JSON    json.RawMessage `json:"json"`
	} `json:"schemas"`
	Reads []string `json:"reads"`
	// BigSchema is the size of a schema it declares (too large to pass
	// in its settings).
	BigSchema int `json:"big_schema"`
	// Body and Version are what it emits as "order" once started (its
	// declared schema's version, or another).
	Body    json.RawMessage `json:"body"`
	Version string          `json:"version"`
	// AMQP is a broker URL the "network" attack dials as a client of its
	// own; Connect are the HOST:PORTs it connects to over TCP.
	AMQP    string   `json:"amqp"`
	Connect []string `json:"connect"`
}

var (
	cfg      settings
	reportMu sync.Mutex
)

// reportConn is the connection to the test's report socket, dialled at
// the first report and kept: one connection keeps the lines in order.
var reportConn net.Conn

// report sends one line to the test's report socket.
func report(step, got string, err error) {
	reportMu.Lock()
	defer reportMu.Unlock()
	line := map[string]string{"attack": cfg.Attack, "step": step, "got": got}
	if err != nil {
		line["err"] = err.Error()
		if len(line["err"]) > 2000 {
			line["err"] = line["err"][:2000]
		}
	}
	b, _ := json.Marshal(line)
	if reportConn == nil {
		c, derr := net.Dial("unix", cfg.Report)
		if derr != nil {
			fmt.Fprintln(os.Stderr, "evilmodule: report:", derr)
			return
		}
		reportConn = c
	}
	if _, werr := reportConn.Write(append(b, '\n')); werr != nil {
		fmt.Fprintln(os.Stderr, "evilmodule: report:", werr)
	}
}

func main() {
	if err := json.Unmarshal([]byte(os.Getenv(plugin.EnvSettings)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "evilmodule: settings:", err)
		os.Exit(2)
	}
	s := &server{}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: plugin.Handshake(),
		Plugins: plugin.Set(func(b *goplugin.GRPCBroker) pb.ModuleServer {
			s.broker = b
			return s
		}),
		GRPCServer: goplugin.DefaultGRPCServer,
	})
}

type server struct {
	pb.UnimplementedModuleServer
	broker *goplugin.GRPCBroker
	host   pb.HostClient
}

func (s *server) Describe(context.Context, *pb.Empty) (*pb.Description, error) {
	d := &pb.Description{Name: cfg.Name}
	switch cfg.Attack {
	case "consume":
		d.Consumes = []*pb.Consume{{Queue: cfg.Queue, Prefetch: 1}}
	case "deadletters":
		d.DeadLetters = true
	case "history":
		// The mesh's history, past the sdk: every event routed, which
		// its entry does not grant it.
		d.History, d.HistoryFrom = true, -1
	case "bigerror", "receive":
		d.Patterns = []string{cfg.Pattern}
	case "schemas":
		// Schemas the host compiles: one that refers to a file meshd
		// can read, too many, too large, for an event it does not
		// declare; reads for a pattern it does not subscribe.
		d.Emits = []string{"order"}
		for _, sc := range cfg.Schemas {
			d.Schemas = append(d.Schemas, &pb.SchemaDecl{Event: sc.Event, Version: sc.Version, Json: sc.JSON})
		}
		for i := range cfg.Size {
			d.Schemas = append(d.Schemas, &pb.SchemaDecl{Event: "order", Version: fmt.Sprint(i), Json: []byte(`true`)})
		}
		if cfg.BigSchema > 0 {
			d.Schemas = append(d.Schemas, &pb.SchemaDecl{Event: "order", Version: "big", Json: []byte(`{"description": "` + strings.Repeat("x", cfg.BigSchema) + `"}`)})
		}
		if cfg.Reads != nil {
			d.Reads = []*pb.Reads{{Pattern: cfg.Pattern, Versions: cfg.Reads}}
		}
	case "filters":
		// Filters for the node to evaluate, not as any sdk would make
		// them: too large, too deep, too many for its patterns.
		d.Patterns, d.Filters = []string{cfg.Pattern}, cfg.Filters
		if cfg.Size > 0 {
			d.Filters = []string{strings.Repeat("(", cfg.Size)} // too large to pass in its settings
		}
		if cfg.Queue != "" {
			d.Consumes = []*pb.Consume{{Queue: cfg.Queue, Prefetch: 1, Filter: cfg.Filter}}
		}
	}
	// A directory of its own, when meshd gave it one: it can keep a file
	// there.
	if dir := os.Getenv("MESH_MODULE_DIR"); dir != "" {
		err := os.WriteFile(filepath.Join(dir, "secret"), []byte("of "+cfg.Name), 0o600)
		report("own dir "+dir, fmt.Sprintf("uid %d", os.Getuid()), err)
	}
	// What it found before anything was asked of it: its environment,
	// meshd's /proc entries, other processes' sockets.
	s.snoop()
	return d, nil
}

// tryPrivileges reports the process's capabilities and tries what they
// would let it do: become root, give its directory to root, signal init
// (root's), read /etc/shadow. A meshd that holds capabilities to start
// modules as users of their own must hand none of them on.
func tryPrivileges() {
	var capLines []string
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Cap") {
				capLines = append(capLines, l)
			}
		}
	}
	report("capabilities", strings.Join(capLines, "\n"), nil)
	_, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, 0, 0, 0)
	report("setuid root", "", errnoErr(e))
	_, _, e = syscall.RawSyscall(syscall.SYS_SETRESGID, 0, 0, 0)
	report("setgid root", "", errnoErr(e))
	if dir := os.Getenv("MESH_MODULE_DIR"); dir != "" {
		report("chown own dir to root", "", os.Lchown(dir, 0, 0))
	}
	report("signal init", "", syscall.Kill(1, 0))
	_, err := os.ReadFile("/etc/shadow")
	report("read /etc/shadow", "", err)
}

// errnoErr is e as an error, nil for 0.
func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// snoop reports what the process can see of its node from the start.
func (s *server) snoop() {
	if cfg.Attack != "snoop" {
		return
	}
	report("environ", strings.Join(os.Environ(), "\n"), nil)
	ppid := os.Getppid()
	for _, what := range []string{"environ", "cmdline", "mem"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", ppid, what))
		if what == "mem" && err == nil {
			b = []byte("readable")
		}
		report("proc."+what, string(b), err)
	}
	// Signal 0 checks the right to signal meshd without sending one.
	report("signal meshd", "", syscall.Kill(ppid, 0))
	tried := make(chan struct{})
	go func() {
		// On a thread of its own, left locked: were a raw call below to
		// succeed, it would change that thread alone, which then ends.
		goruntime.LockOSThread()
		tryPrivileges()
		close(tried)
	}()
	<-tried
	// Files of meshd's and other modules' it must not read; $TMPDIR in
	// one is its own TMPDIR (another module's is beside it), reported as
	// written.
	for _, path := range strings.Split(cfg.Queue, ",") {
		if path == "" {
			continue
		}
		real := strings.ReplaceAll(path, "$TMPDIR", os.Getenv("TMPDIR"))
		if st, err := os.Stat(real); err == nil && st.IsDir() {
			entries, err := os.ReadDir(real)
			report("read "+path, fmt.Sprint(len(entries)), err)
			planted := filepath.Join(real, "planted-by-evil")
			report("write "+path+"/planted-by-evil", "", os.WriteFile(planted, []byte("x"), 0o644))
			continue
		}
		b, err := os.ReadFile(real)
		report("read "+path, string(b), err)
	}
}

func (s *server) Start(ctx context.Context, r *pb.StartRequest) (*pb.Empty, error) {
	conn, err := s.broker.Dial(r.HostBrokerId)
	if err != nil {
		report("dial host", "", err)
		return nil, err
	}
	s.host = pb.NewHostClient(conn)
	go s.attack()
	return &pb.Empty{}, nil
}

func (s *server) attack() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch cfg.Attack {
	case "network":
		network()
	case "name":
		res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "invoice.sent", Body: []byte(`{}`)}}})
		report("emit as claimed name", fmt.Sprint(res), err)
	case "call":
		res, err := s.host.Call(ctx, &pb.CallRequest{Tool: cfg.Tool, Body: []byte(`{}`), DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano()})
		report("call", fmt.Sprintf("%v|%s|%s", res.GetErrorKind(), res.GetToolCode(), res.GetError()), err)
	case "eventid":
		// Another module's event id as its own, named as the cause so
		// the host would derive it if it trusted the process.
		res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "forged", Body: []byte(`{}`), Id: cfg.ID, CausationId: cfg.ID}}})
		got := ""
		if err == nil && len(res.Results) == 1 {
			got = res.Results[0].Id + "|" + res.Results[0].Error
		}
		report("emit with another's id", got, err)
	case "outboxid":
		// An outbox row (module protocol 8) that names another module's
		// event id as its id, and that id as its ref's scope, as if it
		// were that module's row.
		res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "forged", Body: []byte(`{}`), Id: cfg.ID, CausationId: cfg.ID,
			Outbox: true, OutboxScope: cfg.ID, OutboxN: 0, OutboxUnixMillis: 1_700_000_000_000}}})
		got := ""
		if err == nil && len(res.Results) == 1 {
			got = res.Results[0].Id + "|" + res.Results[0].Error
		}
		report("outbox row with another's id", got, err)
	case "handling":
		// Handling tokens the host never handed this process (it handles
		// nothing), guessed, as an emit's and a call's handling, each
		// asking for a derived id.
		var got []string
		for _, token := range []uint64{1, 2, 3, 1 << 40} {
			res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "guessed", Body: []byte(`{}`), Id: "x", Handling: token}}})
			if err != nil || len(res.Results) != 1 {
				got = append(got, fmt.Sprintf("emit %d: %v", token, err))
				continue
			}
			got = append(got, fmt.Sprintf("emit %d: %s %s|%s", token, res.Results[0].ErrorKind, res.Results[0].Id, res.Results[0].Error))
			r, err := s.host.Call(ctx, &pb.CallRequest{Tool: cfg.Tool, Body: []byte(`{}`), Id: "x", Handling: token,
				DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano()})
			got = append(got, fmt.Sprintf("call %d: %s %s|%s %v", token, r.GetErrorKind(), r.GetBody(), r.GetError(), err))
		}
		report("guessed handlings", strings.Join(got, "\n"), nil)
	case "requestid":
		res, err := s.host.Call(ctx, &pb.CallRequest{Tool: cfg.Tool, Body: []byte(`{}`), Id: cfg.ID, CausationId: cfg.ID,
			DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano()})
		report("call with another's request id", fmt.Sprintf("%s|%s", res.GetBody(), res.GetError()), err)
	case "hugebatch":
		b := &pb.EmitBatch{}
		for range cfg.Size {
			b.Emits = append(b.Emits, &pb.Emit{Name: "spam", Body: []byte(`{}`)})
		}
		res, err := s.host.Emit(ctx, b)
		report("huge batch", fmt.Sprint(len(res.GetResults())), err)
	case "bigemit":
		body := make([]byte, cfg.Size)
		for i := range body {
			body[i] = 'a'
		}
		body[0], body[len(body)-1] = '"', '"'
		res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "big", Body: body}}})
		report("big emit", fmt.Sprint(len(res.GetResults())), err)
	case "sockets":
		s.trySockets(ctx)
	case "schemas":
		// An emit past the sdk: a body breaking its declared schema, or
		// asking for a version it does not declare.
		res, err := s.host.Emit(ctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "order", Body: cfg.Body, Schema: cfg.Version}}})
		got := ""
		if err == nil && len(res.Results) == 1 {
			got = res.Results[0].Id + "|" + res.Results[0].Error
		}
		report("emit against its schema", got, err)
	}
	report("done", "", nil)
}

// trySockets dials every go-plugin socket in the temporary directory
// (another module's, and the host's callback listeners) without this
// run's certificate, and tries to use it.
func (s *server) trySockets(ctx context.Context) {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "plugin*"))
	tried := 0
	for _, path := range matches {
		if st, err := os.Stat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
			continue
		}
		tried++
		dialer := func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}
		conn, err := grpc.NewClient("passthrough:///"+path, grpc.WithContextDialer(dialer), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			report("socket "+path, "", err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, errModule := pb.NewModuleClient(conn).Describe(cctx, &pb.Empty{})
		_, errHost := pb.NewHostClient(conn).Emit(cctx, &pb.EmitBatch{Emits: []*pb.Emit{{Name: "through.another", Body: []byte(`{}`)}}})
		cancel()
		conn.Close()
		got := "refused"
		if errModule == nil || errHost == nil {
			got = "ACCEPTED"
		}
		report("socket "+path, got, fmt.Errorf("describe: %v; emit: %v", errModule, errHost))
	}
	report("sockets tried", fmt.Sprint(tried), nil)
}

func (s *server) Deliver(stream pb.Module_DeliverServer) error {
	for {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, d := range b.Deliveries {
			if cfg.Attack == "receive" { // an honest consumer: says what it got
				report("delivery", d.Id, nil)
			}
			if cfg.Attack == "bigerror" {
				report("delivery", d.Id, nil)
				huge := strings.Repeat("x", cfg.Size)
				err := stream.Send(&pb.OutcomeBatch{Outcomes: []*pb.Outcome{{Seq: d.Seq, Kind: pb.Outcome_FAILED, Error: huge}}})
				report("sent the big error", strconv.Itoa(os.Getpid()), err)
				continue
			}
			_ = stream.Send(&pb.OutcomeBatch{Outcomes: []*pb.Outcome{{Seq: d.Seq, Kind: pb.Outcome_OK}}})
		}
	}
}

func (s *server) Answer(context.Context, *pb.ToolRequest) (*pb.ToolAnswer, error) {
	return &pb.ToolAnswer{IsError: true, Message: "evil serves nothing"}, nil
}
