package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/guest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// topologyCommand is `meshctl topology`: the broker objects and rights the
// mesh needs.
func topologyCommand() *cli.Command {
	return &cli.Command{
		Name:  "topology",
		Usage: "what the mesh needs on the broker",
		Subcommands: []*cli.Command{
			{
				Name: "print",
				Usage: "print every exchange and queue a node declares (the mesh's, its own and its modules'), with their arguments " +
					"and bindings (a module queue's from the node's binding record, in its state_dir)",
				Flags: []cli.Flag{configFlag(), &cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
					&cli.BoolFlag{Name: "json", Usage: "print one JSON object per object"}},
				Action: topologyPrint,
			},
			{
				Name: "check",
				Usage: "compare the live broker with what a node declares: each exchange and queue missing or declared with other " +
					"arguments, and each binding missing or not the mesh's, is reported (exit 1). Bindings are read from the management " +
					"API (AMQP cannot list them); a module queue's are compared with the node's binding record, so run it where the " +
					"node's state_dir is. A broker that accepts guest/guest from this host is a WARNING, no difference",
				Flags: []cli.Flag{configFlag(), &cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
					&cli.StringFlag{Name: "management-url", EnvVars: []string{"MESH_MANAGEMENT_URL"},
						Usage: "the broker's management API, http(s)://HOST:PORT (default: the AMQP host, port 15672; the AMQP URL's user)"},
					&cli.BoolFlag{Name: "no-bindings", Usage: "check exchanges and queues only (no management API)"},
					&cli.BoolFlag{Name: "all", Usage: "print every finding, the ok ones too (by default: the problems, the UNCHECKED and a summary)"},
					&cli.BoolFlag{Name: "json", Usage: "print one JSON object per finding, every one"}},
				Action: topologyCheck,
			},
			permissionsCommand(),
		},
	}
}

// configFlag is the node configuration the topology commands read.
func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Required: true, Usage: "the node's configuration `FILE` (mesh.yaml)"}
}

// nodeObjects reads the node's config and returns it with the broker
// objects the node declares.
func nodeObjects(c *cli.Context) (nodeconfig.File, []runtime.BrokerObject, error) {
	if c.NArg() > 0 {
		return nodeconfig.File{}, nil, usagef("%s takes no arguments, got %q", c.Command.Name, c.Args().Slice())
	}
	f, err := nodeconfig.Load(c.String("config"))
	if err != nil {
		return f, nil, err
	}
	if n := c.String("node"); n != "" {
		f.Node = n
	}
	if f.Node == "" {
		return f, nil, fmt.Errorf("%s names no node: give --node", c.String("config"))
	}
	mcs := make(map[string]runtime.ModuleConfig, len(f.Modules))
	for _, m := range f.Modules {
		mcs[m.Name] = m.ModuleConfig()
	}
	objs, err := runtime.NodeObjects(f.Runtime(), mcs)
	if err != nil {
		return f, nil, err
	}
	mesh := runtime.MeshObjects()
	if f.Runtime().Delays {
		mesh = append(mesh, runtime.DelayObjects()...)
	}
	return f, append(mesh, objs...), nil
}

// bindingText is a binding as the commands print it.
func bindingText(b runtime.Binding) string {
	return fmt.Sprintf("%s %q", b.Exchange, b.Key)
}

// objectJSON is a broker object as print --json gives it.
type objectJSON struct {
	Kind       string            `json:"kind"`
	Name       string            `json:"name"`
	Type       string            `json:"type"`
	Durable    bool              `json:"durable"`
	Exclusive  bool              `json:"exclusive,omitempty"`
	AutoDelete bool              `json:"auto_delete,omitempty"`
	Arguments  amqp.Table        `json:"arguments,omitempty"`
	Binds      string            `json:"binds,omitempty"`
	Bindings   []runtime.Binding `json:"bindings,omitempty"`
	// BindingsKnown is false for a module queue without a binding record.
	BindingsKnown bool `json:"bindings_known"`
	Optional      bool `json:"optional,omitempty"`
	// When says when an optional object exists.
	When string `json:"when,omitempty"`
}

// argsText is an object's arguments as k=v, sorted.
func argsText(args amqp.Table) string {
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, args[k])
	}
	return strings.Join(parts, " ")
}

func topologyPrint(c *cli.Context) error {
	f, objs, err := nodeObjects(c)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(jsonWriter{c.App.Writer})
		for _, o := range objs {
			if err := enc.Encode(objectJSON{Kind: o.Kind, Name: o.Name, Type: o.Type, Durable: o.Durable, Exclusive: o.Exclusive,
				AutoDelete: o.AutoDelete, Arguments: o.Args, Binds: o.Binds, Bindings: o.Bindings, BindingsKnown: o.BindingsKnown,
				Optional: o.When != "", When: o.When}); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tTYPE\tFLAGS\tARGUMENTS\tBOUND TO")
	for _, o := range objs {
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{o.Durable, "durable"}, {o.Exclusive, "exclusive"}, {o.AutoDelete, "auto-delete"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		binds := o.Binds
		if len(o.Bindings) > 0 {
			texts := make([]string, len(o.Bindings))
			for i, b := range o.Bindings {
				texts[i] = bindingText(b)
			}
			binds = strings.Join(texts, ", ")
		}
		if !o.BindingsKnown {
			binds += " (no binding record here)"
		}
		if o.When != "" {
			binds += " (" + o.When + ")"
		}
		args := argsText(o.Args)
		if _, limits := runtime.PolicyArgs(o.Args); limits != nil && f.Runtime().QueuePolicies {
			// ADR 43: where the node's user may set policies.
			if f.Runtime().QueueLimitPolicyOnly {
				args += " (x-delivery-limit as policy " + runtime.QueuePolicyName(o.Name) + " where the node may set policies)"
			} else {
				args += " (and policy " + runtime.QueuePolicyName(o.Name) + ", which may lower it, where the node may set policies)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", o.Kind, escape(o.Name), escape(o.Type), strings.Join(flags, ","), escape(args), escape(binds))
	}
	return tw.Flush()
}

// finding is one line of topology check: a verdict (ok, MISSING, DIFFERS,
// EXTRA, UNCHECKED, ERROR) on an object or a binding, or a WARNING of what
// the broker lets anyone do (the user guest).
type finding struct {
	Verdict string `json:"verdict"`
	Kind    string `json:"kind"` // exchange, queue, binding or user
	Name    string `json:"name"` // a binding's is "exchange \"key\" -> queue"
	Detail  string `json:"detail,omitempty"`
}

// problem says the finding is a difference from what the node declares.
func (f finding) problem() bool {
	return f.Verdict != "ok" && f.Verdict != "UNCHECKED" && f.Verdict != "WARNING"
}

func topologyCheck(c *cli.Context) error {
	f, objs, err := nodeObjects(c)
	if err != nil {
		return err
	}
	if !c.IsSet("amqp-url") && !c.IsSet("amqp-urls") && (f.AMQPURL != "" || len(f.AMQPURLs) > 0) {
		if err := c.Set("amqp-url", f.AMQPURL); err != nil {
			return err
		}
		for _, u := range f.AMQPURLs {
			if err := c.Set("amqp-urls", u); err != nil {
				return err
			}
		}
	}
	ctx, conn, url, done, err := brokerSessionAt(c)
	if err != nil {
		return err
	}
	defer done()
	var api *managementAPI
	if !c.Bool("no-bindings") {
		// The management API of the cluster node that answered.
		if api, err = newManagementAPI(url, c.String("management-url")); err != nil {
			return err
		}
	}
	var findings []finding
	report := func(fd finding) error {
		findings = append(findings, fd)
		if c.Bool("json") {
			return json.NewEncoder(jsonWriter{c.App.Writer}).Encode(fd)
		}
		if fd.Verdict == "ok" && !c.Bool("all") {
			return nil // counted in the summary
		}
		// Names and details come from the broker (its bindings, its reasons).
		_, err := fmt.Fprintf(c.App.Writer, "%-9s %s %s%s\n", fd.Verdict, fd.Kind, escape(fd.Name), escape(colon(fd.Detail)))
		return err
	}
	var apiDown error // once the API fails, the other queues' bindings are not asked for
	for _, o := range objs {
		verdict := checkObject(conn, o)
		word, detail, _ := strings.Cut(verdict, " ")
		if err := report(finding{Verdict: word, Kind: o.Kind, Name: o.Name, Detail: detail}); err != nil {
			return err
		}
		if o.Kind != "queue" || word != "ok" || strings.HasPrefix(detail, "absent") || api == nil {
			continue
		}
		if apiDown == nil {
			for _, fd := range checkBindings(ctx, api, o) {
				if errors.Is(fd.err, errNoManagementAPI) {
					apiDown = fd.err
					break
				}
				if err := report(fd.finding); err != nil {
					return err
				}
			}
		}
	}
	// No difference, but what anyone on this host may do as guest
	// (internal/guest), as meshd says at start.
	if tc, err := tlsSettings(c).ClientConfig(); err == nil {
		for _, w := range guest.Probe(ctx, f.Runtime().Brokers()[0], tc).Warnings() {
			if err := report(finding{Verdict: "WARNING", Kind: "user", Name: guest.Name, Detail: w}); err != nil {
				return err
			}
		}
	}
	problems, unchecked := 0, 0
	checked := map[string]int{}
	for _, fd := range findings {
		if fd.problem() {
			problems++
		}
		if fd.Verdict == "UNCHECKED" {
			unchecked++
		} else {
			checked[fd.Kind]++
		}
	}
	if apiDown != nil {
		if err := report(finding{Verdict: "UNCHECKED", Kind: "binding", Name: "(all)",
			Detail: apiDown.Error() + "; enable it (rabbitmq-plugins enable rabbitmq_management), give --management-url, or --no-bindings"}); err != nil {
			return err
		}
		unchecked++
	}
	if !c.Bool("json") {
		verdict := "all as declared"
		if problems > 0 {
			verdict = fmt.Sprintf("%d differ from what the node declares (above)", problems)
		}
		fmt.Fprintf(c.App.Writer, "checked %d exchanges, %d queues and %d bindings of node %s: %s%s\n",
			checked["exchange"], checked["queue"], checked["binding"], escape(f.Node), verdict, map[bool]string{true: " (--all lists every one)", false: ""}[!c.Bool("all")])
	}
	if problems > 0 {
		return fmt.Errorf("%d differences from what node %s declares (%d findings)", problems, f.Node, len(findings))
	}
	if unchecked > 0 {
		fmt.Fprintf(c.App.ErrWriter, "meshctl: no differences, but %d UNCHECKED\n", unchecked)
	}
	return nil
}

// colon is ": " and s, or nothing for an empty s.
func colon(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// bindingFinding is a finding on a binding, or the error that kept the
// bindings from being read.
type bindingFinding struct {
	finding
	err error
}

// checkBindings compares the bindings of queue o on the broker with those
// the node declares: each declared one there (ok) or MISSING, and each
// other one EXTRA. A module queue without a binding record is UNCHECKED.
func checkBindings(ctx context.Context, api *managementAPI, o runtime.BrokerObject) []bindingFinding {
	if !o.BindingsKnown {
		return []bindingFinding{{finding: finding{Verdict: "UNCHECKED", Kind: "binding", Name: "* -> " + o.Name,
			Detail: "no binding record of it in the node's state_dir (the module has not run with it, or check runs on another host)"}}}
	}
	have, found, err := api.queueBindings(ctx, o.Name)
	switch {
	case err != nil:
		return []bindingFinding{{finding: finding{Verdict: "ERROR", Kind: "binding", Name: "* -> " + o.Name, Detail: err.Error()}, err: err}}
	case !found:
		return nil // deleted since its declare was checked; reported then
	}
	var out []bindingFinding
	for _, b := range o.Bindings {
		verdict := "MISSING"
		if slices.Contains(have, b) {
			verdict = "ok"
		}
		out = append(out, bindingFinding{finding: finding{Verdict: verdict, Kind: "binding", Name: bindingText(b) + " -> " + o.Name}})
	}
	for _, b := range have {
		if !slices.Contains(o.Bindings, b) {
			out = append(out, bindingFinding{finding: finding{Verdict: "EXTRA", Kind: "binding", Name: bindingText(b) + " -> " + o.Name,
				Detail: "not one the node declares: it routes events the queue's consumer does not expect"}})
		}
	}
	return out
}

// checkObject compares one object with the broker: "ok", "ok held by a
// running node" (the lock queue), "MISSING ...", or "DIFFERS <the
// broker's reason>". A passive declare says whether it exists; an active
// declare with the expected arguments, of an object that exists, changes
// nothing when they match and is refused (406) when they do not. Each
// declare has a channel of its own, since a refusal closes it.
func checkObject(conn *amqp.Connection, o runtime.BrokerObject) string {
	declare := func(passive bool) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		switch {
		case o.Kind == "exchange" && passive:
			return ch.ExchangeDeclarePassive(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args)
		case o.Kind == "exchange":
			return ch.ExchangeDeclare(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args)
		case passive:
			_, err = ch.QueueDeclarePassive(o.Name, o.Durable, o.AutoDelete, o.Exclusive, false, o.Args)
		default:
			_, err = ch.QueueDeclare(o.Name, o.Durable, o.AutoDelete, o.Exclusive, false, o.Args)
		}
		return err
	}
	var ae *amqp.Error
	err := declare(true)
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		switch {
		case o.When != "":
			return "ok absent (" + o.When + ")"
		case o.Exclusive:
			return "MISSING the node is not running"
		}
		return "MISSING"
	case errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
		return "ok held by a running node"
	case err != nil:
		return "ERROR " + err.Error()
	case o.Exclusive:
		return "ok" // exists, and no other connection may redeclare it
	}
	if err := declare(false); err != nil {
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			if declared, policy := runtime.PolicyArgs(o.Args); policy != nil && o.Kind == "queue" &&
				strings.Contains(ae.Reason, "x-delivery-limit") && strings.Contains(ae.Reason, "current is none") {
				// Declared by a node that keeps the limit in a policy
				// (ADR 43): the rest of its arguments must match.
				o.Args = declared
				if err := declare(false); err != nil {
					if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
						return "DIFFERS " + ae.Reason
					}
					return "ERROR " + err.Error()
				}
				return "ok (its attempt limit is in policy " + runtime.QueuePolicyName(o.Name) + ")"
			}
			return "DIFFERS " + ae.Reason
		}
		return "ERROR " + err.Error()
	}
	return "ok"
}
