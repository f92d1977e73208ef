package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// groupsCommand is `meshctl groups`: the mesh's module groups (ADR 48),
// their members from the heartbeats, and their queues from the broker.
func groupsCommand() *cli.Command {
	return &cli.Command{
		Name: "groups",
		Usage: "list the module groups (a module entry's group:): each group's module, its shared queue group.GROUP.MODULE.events with the events " +
			"waiting in it and its consumers (from the broker), and its members (the nodes whose heartbeats say the module runs there in the " +
			"group, with their status). A group that keeps order by key (partitions:) shows its partitions group.GROUP.MODULE.p000..pNNN (eEpNNN after E changes of its count by meshctl groups repartition), the " +
			"events waiting in them and in its intake, how many have an active consumer, how many each member owns, and its hot keys (those " +
			"a member holds two or more events of, the most first; --json: each partition's waiting events and owner). A queue with no member heard keeps filling: a group every node left is removed by deleting its queues",
		Flags: append(waitFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per group"},
		),
		Action:      groups,
		Subcommands: []*cli.Command{repartitionCommand()},
	}
}

// groupRow is a group as meshctl groups prints it.
type groupRow struct {
	Group  string `json:"group"`
	Module string `json:"module"`
	Queue  string `json:"queue"`
	// Ready and Consumers are the queue's, from a passive declare; nil
	// when the broker has no such queue (Missing says why).
	Ready     *int   `json:"ready,omitempty"`
	Consumers *int   `json:"consumers,omitempty"`
	Missing   string `json:"missing,omitempty"`
	// Members are the nodes heard running the module in the group, by
	// name, with the module's status there.
	Members map[string]string `json:"members"`
	// Partitions is the group's partition count when it keeps order by
	// key (0: it does not), and Each each partition's queue, its ready
	// events and its owner (the member whose heartbeat says it owns it;
	// "" for none heard). Queue then names the first partition; Ready and
	// Consumers are the sums over the partitions and the intake: the
	// events waiting, and the partitions with an active consumer.
	Partitions int              `json:"partitions,omitempty"`
	Each       []partitionState `json:"each,omitempty"`
	// Epoch is the number of the group's partition count (0 its first,
	// one more at each meshctl groups repartition), the highest a member
	// says; Changing says members disagree (a change is under way).
	Epoch    int  `json:"epoch,omitempty"`
	Changing bool `json:"changing,omitempty"`
	// Hot are the group's keys with the most events held by a member (two
	// or more: one in hand and more behind it), the most first, at most
	// hotKeysShown: a key near the members' prefetch holds up the other
	// keys of its partition.
	Hot []hotKey `json:"hot,omitempty"`
}

// hotKey is a key a member of an ordered group holds events of.
type hotKey struct {
	runtime.HotKey
	Node string `json:"node"`
}

// hotKeysShown is how many hot keys a group's row shows.
const hotKeysShown = 3

// partitionState is one partition of an ordered group.
type partitionState struct {
	Partition int    `json:"partition"`
	Queue     string `json:"queue"`
	Ready     *int   `json:"ready,omitempty"`
	Owner     string `json:"owner,omitempty"`
}

func groups(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("groups takes no arguments, got %q", c.Args().Slice())
	}
	heard, err := listenHeartbeats(c)
	if err != nil {
		return err
	}
	rows := map[string]*groupRow{}
	for _, h := range heard {
		for _, m := range h.Modules {
			if m.Group == "" || wire.ValidateWord("group", m.Group) != nil || wire.ValidateWord("module name", m.Name) != nil {
				continue // what a heartbeat says is anyone's: a name that makes no queue is no group
			}
			q := wire.GroupQueue(m.Group, m.Name)
			r := rows[q]
			if r == nil {
				r = &groupRow{Group: m.Group, Module: m.Name, Queue: q, Members: map[string]string{}}
				rows[q] = r
			}
			status := m.Status
			if status == "" {
				status = "running"
			}
			r.Members[h.Node] = status
			if m.Partitions > 0 && m.Partitions <= wire.Slots && m.Epoch >= 0 {
				if r.Partitions > 0 && m.Epoch != r.Epoch {
					r.Changing = true
				}
				if r.Partitions == 0 || m.Epoch > r.Epoch {
					// The latest count a member says: a member behind it
					// follows it.
					r.Partitions, r.Epoch, r.Each = m.Partitions, m.Epoch, nil
					r.Queue = wire.PartitionQueueOf(m.Group, m.Name, m.Epoch, 0)
					for i := range m.Partitions {
						r.Each = append(r.Each, partitionState{Partition: i, Queue: wire.PartitionQueueOf(m.Group, m.Name, m.Epoch, i)})
					}
				}
				if m.Epoch != r.Epoch {
					continue // its partitions are the old count's
				}
				for _, i := range m.Owns {
					if i >= 0 && i < len(r.Each) {
						r.Each[i].Owner = h.Node
					}
				}
				for _, k := range m.Hot[:min(hotKeysShown, len(m.Hot))] { // a heartbeat's list is the sender's: bounded here
					r.Hot = append(r.Hot, hotKey{HotKey: k, Node: h.Node})
				}
			}
		}
	}
	for _, r := range rows {
		slices.SortFunc(r.Hot, func(a, b hotKey) int { return runtime.HotterFirst(a.HotKey, b.HotKey) })
		r.Hot = r.Hot[:min(hotKeysShown, len(r.Hot))]
	}
	if err := readGroupQueues(c, rows); err != nil {
		return err
	}
	queues := slices.Sorted(maps.Keys(rows))
	if c.Bool("json") {
		enc := json.NewEncoder(jsonWriter{c.App.Writer})
		for _, q := range queues {
			if err := enc.Encode(rows[q]); err != nil {
				return err
			}
		}
		return nil
	}
	if len(queues) == 0 {
		_, err := fmt.Fprintf(c.App.Writer, "no group heard within %v %s (%d nodes heard)\n", heardWithin(c), brokerPlace(c), len(heard))
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tMODULE\tQUEUE\tREADY\tCONSUMERS\tMEMBERS\tHOT KEYS")
	for _, q := range queues {
		r := rows[q]
		owns := map[string]int{}
		for _, p := range r.Each {
			if p.Owner != "" {
				owns[p.Owner]++
			}
		}
		var members []string
		for _, n := range slices.Sorted(maps.Keys(r.Members)) {
			m := n
			if s := r.Members[n]; s != "running" {
				m += " " + strings.ToUpper(s)
			}
			if r.Partitions > 0 {
				m += fmt.Sprintf(" (%d of %d partitions)", owns[n], r.Partitions)
			}
			members = append(members, m)
		}
		ready, consumers := "-", "-"
		if r.Ready != nil {
			ready, consumers = fmt.Sprint(*r.Ready), fmt.Sprint(*r.Consumers)
		}
		queue := r.Queue
		if r.Partitions > 1 {
			queue = fmt.Sprintf("%s..p%03d", r.Queue, r.Partitions-1)
		}
		if r.Changing {
			queue += " (count changing)"
		}
		hot := "-"
		if len(r.Hot) > 0 {
			var keys []string
			for _, k := range r.Hot {
				keys = append(keys, fmt.Sprintf("%s (%d on %s, p%03d)", k.Key, k.Waiting, k.Node, k.Partition))
			}
			hot = strings.Join(keys, ", ")
		}
		if r.Partitions == 0 {
			hot = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", escape(r.Group), escape(r.Module), escape(queue), ready, consumers, escape(strings.Join(members, ", ")), escape(hot))
	}
	return tw.Flush()
}

// readGroupQueues reads each group queue's depth and consumers from the
// broker, a passive declare each (a queue not there closes the channel:
// it is opened again for the next).
func readGroupQueues(c *cli.Context, rows map[string]*groupRow) error {
	if len(rows) == 0 {
		return nil
	}
	conn, _, err := dialBroker(c, "meshctl groups")
	if err != nil {
		return err
	}
	defer conn.Close()
	var ch *amqp.Channel
	inspect := func(q string) (*amqp.Queue, error) {
		if ch == nil || ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				return nil, fmt.Errorf("open channel: %w", err)
			}
		}
		got, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("read queue %s: %w", q, err)
		}
		return &got, nil
	}
	for _, key := range slices.Sorted(maps.Keys(rows)) {
		r := rows[key]
		if r.Partitions == 0 {
			got, err := inspect(r.Queue)
			switch {
			case err != nil:
				return err
			case got == nil:
				r.Missing = "the broker has no such queue (no member has attached yet)"
			default:
				ready, consumers := got.Messages, got.Consumers
				r.Ready, r.Consumers = &ready, &consumers
			}
			continue
		}
		// An ordered group: its partitions and its intake.
		ready, consumers := 0, 0
		for i := range r.Each {
			got, err := inspect(r.Each[i].Queue)
			if err != nil {
				return err
			}
			if got == nil {
				r.Missing = "the broker lacks partitions of the group (no member has attached yet)"
				continue
			}
			n := got.Messages
			r.Each[i].Ready = &n
			ready += n
			consumers += got.Consumers
		}
		if got, err := inspect(wire.GroupIntake(r.Group, r.Module)); err != nil {
			return err
		} else if got != nil {
			ready += got.Messages
		}
		r.Ready, r.Consumers = &ready, &consumers
	}
	return nil
}
