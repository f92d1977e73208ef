//go:build soak

package soak

import (
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/clustertest"
	"github.com/meshkit/mesh/internal/wire"
)

// nemesisTargets is what the nemesis may break.
type nemesisTargets struct {
	h             *history
	timeline      io.Writer // a line per fault, with its time
	proxies       map[string][]*brokertest.Proxy
	mds           map[string]*meshd
	vhost         string
	rc            *rawClient
	legacyMu      *sync.Mutex
	declareLegacy func(*amqp.Channel) error
}

// nemesis applies a fault every 0.5-3 s for length, from the schedule
// rng draws; faults with a duration heal in the background, so they
// overlap. It returns once every fault has healed (the brokers all up,
// meshd running, no process stopped), with the count of each kind.
func nemesis(t *testing.T, rng *rand.Rand, length time.Duration, nt *nemesisTargets) map[string]int {
	var (
		mu      sync.Mutex
		faults  = map[string]int{}
		healing sync.WaitGroup
		// One broker node down at a time (the quorum queues keep a
		// majority), one partition per mesh node, one restart per meshd.
		brokerDown  atomic.Bool
		partitioned = map[string]*atomic.Bool{}
		restarting  = map[string]*atomic.Bool{}
		stopped     sync.Map // pid → true while SIGSTOPped
	)
	for _, n := range nodes {
		partitioned[n], restarting[n] = &atomic.Bool{}, &atomic.Bool{}
	}
	count := func(f string) {
		mu.Lock()
		faults[f]++
		fmt.Fprintf(nt.timeline, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), f)
		mu.Unlock()
	}
	// A module process of a random meshd, or 0 while none runs.
	moduleProcess := func(node string) int {
		if restarting[node].Load() {
			return 0
		}
		pids := modulesOf(nt.mds[node].pid())
		if len(pids) == 0 {
			return 0
		}
		return pids[rng.IntN(len(pids))]
	}
	killBroker := func(i int, kind string) {
		if !brokerDown.CompareAndSwap(false, true) {
			return
		}
		if err := cluster.Kill(i); err != nil {
			soakErrorf(t, "%s: %v", kind, err)
		}
		count(kind)
		down := time.Duration(2000+rng.IntN(8000)) * time.Millisecond
		healing.Go(func() {
			pause(down)
			if out, err := cluster.Run("up"); err != nil {
				soakErrorf(t, "restart broker node %d: %v\n%s", i, err, out)
			}
			brokerDown.Store(false)
		})
	}

	deadline := time.Now().Add(length)
	for time.Now().Before(deadline) {
		pause(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
		node := nodes[rng.IntN(len(nodes))]
		meshdNode := nodes[1+rng.IntN(2)]
		broker := 1 + rng.IntN(clustertest.Size)
		d := time.Duration(200+rng.IntN(2800)) * time.Millisecond
		switch rng.IntN(11) {
		case 0: // one connection path cut
			nt.proxies[node][broker-1].Cut()
			count("cut")
		case 1: // a mesh node cut off from every broker node for a while
			if !partitioned[node].CompareAndSwap(false, true) {
				continue
			}
			for _, p := range nt.proxies[node] {
				p.Down()
			}
			count("partition " + node)
			healing.Go(func() {
				pause(d)
				for _, p := range nt.proxies[node] {
					p.Up()
				}
				partitioned[node].Store(false)
			})
		case 2: // edge cut off long enough to fill its spool
			if !partitioned["edge"].CompareAndSwap(false, true) {
				continue
			}
			for _, p := range nt.proxies["edge"] {
				p.Down()
			}
			count("full spool")
			long := 3*time.Second + 2*d
			healing.Go(func() {
				pause(long)
				for _, p := range nt.proxies["edge"] {
					p.Up()
				}
				partitioned["edge"].Store(false)
			})
		case 3:
			killBroker(broker, "broker node killed")
		case 4:
			if brokerDown.Load() {
				continue
			}
			leader, err := cluster.LeaderOf(nt.vhost, wire.ModuleQueue("beta", "worker"))
			if err != nil {
				continue // being elected
			}
			killBroker(leader, "leader killed")
		case 5: // the broker node blocks its publishers
			if _, err := cluster.Ctl(broker, "set_vm_memory_high_watermark", "absolute", "1"); err != nil {
				continue // it is down
			}
			count("memory alarm")
			healing.Go(func() {
				pause(d)
				_, _ = cluster.Ctl(broker, "set_vm_memory_high_watermark", "0.2") // the config's (a restarted node reads it again)
			})
		case 6:
			pid := moduleProcess(meshdNode)
			if pid == 0 {
				continue
			}
			nt.h.interrupt(time.Now().UnixNano(), pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			count("module killed")
		case 7:
			pid := moduleProcess(meshdNode)
			if pid == 0 {
				continue
			}
			if _, loaded := stopped.LoadOrStore(pid, true); loaded {
				continue
			}
			nt.h.interrupt(time.Now().UnixNano(), pid)
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			count("module stopped")
			long := d + time.Duration(rng.IntN(5000))*time.Millisecond // past the worker's 5 s timeout at times
			healing.Go(func() {
				pause(long)
				_ = syscall.Kill(pid, syscall.SIGCONT)
				stopped.Delete(pid)
			})
		case 8:
			if !restarting[meshdNode].CompareAndSwap(false, true) {
				continue
			}
			m := nt.mds[meshdNode]
			at := time.Now().UnixNano()
			nt.h.interrupt(at, m.kill()...)
			count("meshd killed")
			healing.Go(func() {
				pause(d)
				if err := m.start(); err != nil {
					soakErrorf(t, "restart meshd %s: %v", m.name, err)
				}
				restarting[meshdNode].Store(false)
			})
		case 10: // a broker node cut off from the other two (pause_minority pauses it)
			if !brokerDown.CompareAndSwap(false, true) {
				continue
			}
			if err := cluster.Partition(broker); err != nil {
				brokerDown.Store(false)
				t.Logf("partition broker node %d: %v", broker, err)
				continue
			}
			count("broker partitioned")
			long := time.Duration(2000+rng.IntN(8000)) * time.Millisecond
			healing.Go(func() {
				pause(long)
				if err := cluster.Heal(broker); err != nil {
					soakErrorf(t, "heal broker node %d: %v", broker, err)
				}
				// It resumes by itself once it sees the majority again.
				if _, err := cluster.Ctl(broker, "await_startup"); err != nil {
					soakErrorf(t, "broker node %d after the partition: %v", broker, err)
				}
				brokerDown.Store(false)
			})
		case 9: // the consumed queue deleted with what it holds (not the mesh's to keep), then declared again
			if brokerDown.Load() {
				// Not with a member node down: RabbitMQ 3.10 then leaves
				// that node's member behind, it comes back with the old
				// queue's log and wins an election, and the new queue
				// loses what it was given and gets the old one's messages
				// back (docs/clusters.md). The broker's, not the mesh's.
				continue
			}
			nt.legacyMu.Lock()
			nt.h.mu.Lock()
			clear(nt.h.legacyIn) // what is in it goes with it: counted from here
			nt.h.mu.Unlock()
			err := nt.rc.do(func(ch *amqp.Channel) error {
				if _, err := ch.QueueDelete(legacyQueue, false, false, false); err != nil {
					return err
				}
				return nt.declareLegacy(ch)
			})
			if err == nil {
				count("consumed queue deleted")
			} else if err := nt.rc.do(nt.declareLegacy); err != nil {
				t.Logf("declare the consumed queue again: %v (the next fault of its kind will)", err)
			}
			nt.legacyMu.Unlock()
		}
	}
	healing.Wait()
	for _, m := range nt.mds {
		if err := m.awaitReady(); err != nil {
			soakErrorf(t, "after the faults: %v", err)
		}
	}
	fmt.Printf("soak: faults ended; %d kinds applied\n", len(faults))
	return faults
}
