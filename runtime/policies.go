package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokerapi"
)

// Queue settings by policy (docs/adr/0043-queue-settings-by-policy.md).
// A quorum queue's attempt limit, declared as the argument
// x-delivery-limit, cannot change: the broker refuses a declare with
// another value (406), so max_attempts could change only by deleting the
// queue. A node that may set policies keeps the limit in a policy of its
// own per queue, mesh.queue.<queue>, which the broker applies to the live
// queue with its messages in place. It declares a new queue with the
// argument too, as v0.1.0 declares it, so that a rollback to v0.1.0
// declares the same queue (v0.1.0's meshd stops on a queue without it);
// the broker applies the lower of the two, so the policy lowers the limit
// in place and a higher one needs meshctl queue migrate. With
// Config.QueueLimitPolicyOnly it declares the queue without the argument,
// and the limit rises in place too. What a queue is (its type, its
// priorities, where its dead letters go) stays an argument: no policy may
// take it away.

// limitArg is the quorum queue argument of the attempt limit, and
// limitKey the policy key the broker reads the same limit from.
const (
	limitArg = "x-delivery-limit"
	limitKey = "delivery-limit"
)

// PolicyPriority is the priority of the policies the mesh keeps for its
// queues: above an operator's broad policies (priority 0), so a policy of
// ".*" does not take away a queue's attempt limit. Only one policy
// applies to a queue; settings the operator wants on every queue belong
// in an operator policy (rabbitmqctl set_operator_policy), which the
// broker merges with it.
const PolicyPriority = 100

// QueuePolicyName is the name of the policy the mesh keeps for queue.
func QueuePolicyName(queue string) string { return "mesh.queue." + queue }

// QueuePolicy is the policy that carries limits, the settings the mesh
// keeps in policies (delivery-limit), for queue alone.
func QueuePolicy(queue string, limits map[string]any) brokerapi.Policy {
	return brokerapi.Policy{
		Name:       QueuePolicyName(queue),
		Pattern:    "^" + regexp.QuoteMeta(queue) + "$",
		ApplyTo:    "queues",
		Priority:   PolicyPriority,
		Definition: limits,
	}
}

// PolicyArgs splits a queue's arguments into those it is declared with and
// those a policy carries for it, for a node that keeps policies: the
// attempt limit moves to the policy.
func PolicyArgs(args amqp.Table) (declared amqp.Table, policy map[string]any) {
	v, ok := args[limitArg]
	if !ok {
		return args, nil
	}
	declared = maps.Clone(args)
	delete(declared, limitArg)
	return declared, map[string]any{limitKey: v}
}

// policyAPI is the management API the node keeps its queues' policies
// through, for the broker it is on (s), or nil when it declares limits as
// arguments: QueuePolicies is off, the API does not answer, is another
// broker's, or the node's user may not set policies. A definite answer is
// kept for that broker address and logged once; an API that does not
// answer now is asked again at the next declare.
func (n *Node) policyAPI(s *session) *brokerapi.Client {
	if !n.cfg.QueuePolicies {
		return nil
	}
	brokerURL := n.brokers[int(n.brokerAt.Load())%len(n.brokers)]
	n.policies.mu.Lock()
	defer n.policies.mu.Unlock()
	if api, ok := n.policies.decided[brokerURL]; ok {
		return api
	}
	api, final := n.findPolicyAPI(s, brokerURL)
	if final {
		if n.policies.decided == nil {
			n.policies.decided = map[string]*brokerapi.Client{}
		}
		n.policies.decided[brokerURL] = api
	}
	return api
}

// findPolicyAPI asks the management API of brokerURL (or management_url)
// whether the node may keep policies through it; final says whether the
// answer holds (not a transient failure).
func (n *Node) findPolicyAPI(s *session, brokerURL string) (api *brokerapi.Client, final bool) {
	tc, err := n.cfg.TLS.ClientConfig()
	if err != nil {
		n.log.Warn("queue settings are queue arguments: the management API's TLS settings", "err", err)
		return nil, true
	}
	api, err = brokerapi.New(brokerURL, n.cfg.ManagementURL, tc)
	if err != nil {
		n.log.Warn("queue settings are queue arguments: management_url", "err", err)
		return nil, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := api.CanSetPolicies(ctx)
	switch {
	case errors.Is(err, brokerapi.ErrRefused):
		n.log.Info("queue settings are queue arguments, as in v0.1.0: the broker user may not use the management API (tag it policymaker to keep them in policies: see ADR 43), so max_attempts cannot change on an existing queue without meshctl queue migrate", "user", n.userID)
		return nil, true
	case err != nil:
		n.log.Warn("queue settings are queue arguments for now: the management API does not answer (a queue declared meanwhile keeps its limit as an argument, which meshctl queue migrate moves); enable the rabbitmq_management plugin or set management_url", "err", err)
		return nil, false
	case !ok:
		n.log.Info("queue settings are queue arguments, as in v0.1.0: the broker user may not set policies (tag it policymaker to keep them in policies: see ADR 43), so max_attempts cannot change on an existing queue without meshctl queue migrate", "user", n.userID)
		return nil, true
	}
	// The API must be the broker's the node is on: one derived from the
	// broker URL's host may be another's (a proxy, a tunnel, a private
	// port), whose policies would not apply here while the node
	// declared its queues without their limit.
	amqpName, _ := s.pubConn.Properties["cluster_name"].(string)
	apiName, err := api.ClusterName(ctx)
	switch {
	case err != nil:
		n.log.Warn("queue settings are queue arguments for now: the management API does not answer", "err", err)
		return nil, false
	case apiName == "" || apiName != amqpName:
		n.log.Warn("queue settings are queue arguments, as in v0.1.0: the management API is not the broker's the node is connected to (set management_url to its API)",
			"management_api", api.URL(), "api_cluster", apiName, "broker_cluster", amqpName)
		return nil, true
	}
	n.log.Info("queue settings are kept in policies", "management_api", api.URL())
	return api, true
}

// declareQueue declares a durable queue with args. An attempt limit in
// args (x-delivery-limit) goes to the queue's policy when the node keeps
// policies (policyAPI), set before the queue is declared so it never runs
// without one; a new queue is declared with the argument as well unless
// Config.QueueLimitPolicyOnly, and a queue that exists with the argument
// is declared with the argument it has (the declare must be equivalent),
// and its policy can then lower the limit, not raise it (the broker
// applies the lower one). Without policies, a queue that carries its limit in a
// policy (made by a node that keeps them) is declared without the
// argument, with a warning, rather than refused.
//
// It declares on a channel of open's, and returns the channel to go on
// with: another one of open's if a refusal closed the first (drop is
// given the closed one).
func (n *Node) declareQueue(ctx context.Context, s *session, open func() (*amqp.Channel, error), drop func(*amqp.Channel), queue string, args amqp.Table) (*amqp.Channel, error) {
	ch, err := open()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	declared, policy := PolicyArgs(args)
	if policy == nil {
		_, err := ch.QueueDeclare(queue, true, false, false, false, args)
		return ch, err
	}
	api := n.policyAPI(s)
	if api != nil {
		done, err := n.declareWithPolicy(ctx, api, ch, queue, declared, policy)
		if done || !errors.Is(err, brokerapi.ErrUnavailable) {
			return ch, err
		}
		// The API went away (its broker node is down, say): the queue is
		// declared as a node without policies declares it, and attaches.
		n.log.Warn("the management API does not answer; the queue is declared without touching its policy", "queue", queue, "err", err)
	}
	_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, limitArg) || !strings.Contains(ae.Reason, "none") {
		return ch, err
	}
	// The queue has no x-delivery-limit: a node keeping policies made it.
	drop(ch)
	if ch, err = open(); err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	n.log.Warn("the queue's attempt limit is a policy's, which this node cannot set now: a changed max_attempts does not apply to it until a node that keeps policies declares it", "queue", queue, "policy", QueuePolicyName(queue))
	_, err = ch.QueueDeclare(queue, true, false, false, false, declared)
	return ch, err
}

// declareWithPolicy declares queue with the arguments declared, its
// attempt limit in its policy (see declareQueue). done is false, with an
// error wrapping brokerapi.ErrUnavailable, when the management API did not
// answer before anything was declared.
func (n *Node) declareWithPolicy(ctx context.Context, api *brokerapi.Client, ch *amqp.Channel, queue string, declared amqp.Table, policy map[string]any) (done bool, err error) {
	declared = maps.Clone(declared)
	q, err := api.Queue(ctx, queue)
	switch {
	case errors.Is(err, brokerapi.ErrNotFound):
		if !n.cfg.QueueLimitPolicyOnly {
			// As the previous release declares it, so a rollback to it
			// declares the same queue (ADR 43, amendment).
			declared[limitArg] = policy[limitKey]
		}
	case err != nil:
		return false, fmt.Errorf("read queue %s through the management API: %w", queue, err)
	default:
		if was, ok := q.IntArgument(limitArg); ok {
			declared[limitArg] = was
			if want := toInt64(policy[limitKey]); want > was {
				n.log.Warn("max_attempts is above the limit the queue was declared with (an argument, which the broker keeps, declared by v0.1.0 or, for a rollback to it, by this release: queue_limit_policy_only): the lower one applies; meshctl queue migrate moves the queue to the new limit", "queue", queue, "max_attempts", want+1, "queue_attempts", was+1)
			}
		}
	}
	if err := ensurePolicy(ctx, api, QueuePolicy(queue, policy)); err != nil {
		return false, err
	}
	_, err = ch.QueueDeclare(queue, true, false, false, false, declared)
	return true, err
}

// ensurePolicy sets p unless the broker has it already: setting a policy
// makes the broker apply its policies to the virtual host's queues again,
// so a module attaching (at every reconnect) does not rewrite an unchanged
// one.
func ensurePolicy(ctx context.Context, api *brokerapi.Client, p brokerapi.Policy) error {
	have, err := api.Policy(ctx, p.Name)
	if err == nil && have.Pattern == p.Pattern && have.ApplyTo == p.ApplyTo && have.Priority == p.Priority && sameDefinition(have.Definition, p.Definition) {
		return nil
	}
	return api.PutPolicy(ctx, p)
}

// sameDefinition says whether a policy definition read back (numbers as
// float64) is want.
func sameDefinition(have, want map[string]any) bool {
	if len(have) != len(want) {
		return false
	}
	for k, w := range want {
		if h, ok := have[k]; !ok || fmt.Sprint(h) != fmt.Sprint(w) {
			return false
		}
	}
	return true
}

// toInt64 is an argument's integer value.
func toInt64(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case int:
		return int64(v)
	case int32:
		return int64(v)
	case float64:
		return int64(v)
	}
	return 0
}
