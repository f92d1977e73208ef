package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"time"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/runtime"
)

// managementAPI reads what AMQP 0-9-1 cannot: a queue's bindings. It asks
// the RabbitMQ management plugin's HTTP API, with the broker user of the
// AMQP URL unless the management URL names one.
type managementAPI struct {
	base       *neturl.URL // scheme and host, without credentials
	user, pass string
	vhost      string
	client     *http.Client
}

// errNoManagementAPI is what queueBindings returns when the management
// API does not answer as one: the plugin is off, or the URL is wrong.
var errNoManagementAPI = errors.New("the management API does not answer")

// newManagementAPI is the management API of the broker at amqpURL: at
// mgmtURL if given, else on the AMQP host at port 15672 (http), or 15671
// (https) for an amqps:// broker.
func newManagementAPI(amqpURL, mgmtURL string) (*managementAPI, error) {
	base, user, pass, vhost, err := brokerapi.Endpoint(amqpURL, mgmtURL)
	switch {
	case errors.Is(err, brokerapi.ErrManagementURL):
		return nil, fmt.Errorf("management URL %s: want http(s)://HOST:PORT", redactURL(mgmtURL))
	case err != nil:
		return nil, fmt.Errorf("broker URL %s: %w", redactURL(amqpURL), err)
	}
	return &managementAPI{base: base, user: user, pass: pass, vhost: vhost, client: &http.Client{Timeout: 10 * time.Second}}, nil
}

// queueBindings returns the bindings of queue, the default exchange's
// left out (every queue has it). found is false if the queue does not
// exist.
func (a *managementAPI) queueBindings(ctx context.Context, queue string) (bindings []runtime.Binding, found bool, err error) {
	u := *a.base
	u.Path = "/api/queues/" + a.vhost + "/" + queue + "/bindings"
	u.RawPath = "/api/queues/" + neturl.PathEscape(a.vhost) + "/" + neturl.PathEscape(queue) + "/bindings"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, false, err
	}
	req.SetBasicAuth(a.user, a.pass)
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("%w at %s: %v", errNoManagementAPI, a.base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, false, fmt.Errorf("bindings of %s: %w", queue, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && json.Valid(body):
		return nil, false, nil // the API's own 404: no such queue
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, false, fmt.Errorf("%w at %s: user %q is refused (it needs the management, monitoring or administrator tag)", errNoManagementAPI, a.base, a.user)
	case resp.StatusCode != http.StatusOK:
		return nil, false, fmt.Errorf("%w at %s: %s", errNoManagementAPI, a.base, resp.Status)
	}
	var raw []struct {
		Source          string `json:"source"`
		RoutingKey      string `json:"routing_key"`
		DestinationType string `json:"destination_type"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, false, fmt.Errorf("%w at %s: bindings of %s: %v", errNoManagementAPI, a.base, queue, err)
	}
	for _, b := range raw {
		if b.Source != "" && b.DestinationType == "queue" {
			bindings = append(bindings, runtime.Binding{Exchange: b.Source, Key: b.RoutingKey})
		}
	}
	return bindings, true, nil
}

// unwrapURLError drops net/http's "Get URL:" prefix (the URL is said
// once, by the caller).
func unwrapURLError(err error) error {
	var ue *neturl.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// get reads path (already escaped) of the management API into v.
func (a *managementAPI) get(ctx context.Context, path string, v any) error {
	u := *a.base
	u.Path, u.RawPath = "", ""
	full := u.String() + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, full, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(a.user, a.pass)
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %v", errNoManagementAPI, a.base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w at %s: %v", errNoManagementAPI, a.base, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%w at %s: user %q is refused (it needs the management, monitoring or administrator tag)", errNoManagementAPI, a.base, a.user)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%w at %s: %s", errNoManagementAPI, a.base, resp.Status)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w at %s: %s: %v", errNoManagementAPI, a.base, path, err)
	}
	return nil
}

// rateOf is a management API rate: {"rate": 1.5}.
type rateOf struct {
	Rate float64 `json:"rate"`
}

// apiQueue is a queue as the management API lists it.
type apiQueue struct {
	Name                 string `json:"name"`
	Type                 string `json:"type"`
	Ready                int    `json:"messages_ready"`
	Unacked              int    `json:"messages_unacknowledged"`
	Consumers            int    `json:"consumers"`
	HeadMessageTimestamp *int64 `json:"head_message_timestamp"`
	MessageStats         struct {
		Publish    rateOf `json:"publish_details"`
		DeliverGet rateOf `json:"deliver_get_details"`
		Ack        rateOf `json:"ack_details"`
		Redeliver  rateOf `json:"redeliver_details"`
	} `json:"message_stats"`
}

// queues lists the virtual host's queues.
func (a *managementAPI) queues(ctx context.Context) ([]apiQueue, error) {
	var qs []apiQueue
	err := a.get(ctx, "/api/queues/"+neturl.PathEscape(a.vhost), &qs)
	return qs, err
}

// exchangeIn is the rate of messages published into exchange.
func (a *managementAPI) exchangeIn(ctx context.Context, exchange string) (float64, error) {
	var ex struct {
		MessageStats struct {
			PublishIn rateOf `json:"publish_in_details"`
		} `json:"message_stats"`
	}
	err := a.get(ctx, "/api/exchanges/"+neturl.PathEscape(a.vhost)+"/"+neturl.PathEscape(exchange), &ex)
	return ex.MessageStats.PublishIn.Rate, err
}

// alarms are the resource alarms in force on the broker's nodes, and the
// broker's version.
func (a *managementAPI) alarms(ctx context.Context) (alarms []string, version string, err error) {
	var nodes []struct {
		Name      string `json:"name"`
		MemAlarm  bool   `json:"mem_alarm"`
		DiskAlarm bool   `json:"disk_free_alarm"`
		Running   bool   `json:"running"`
	}
	if err := a.get(ctx, "/api/nodes", &nodes); err != nil {
		return nil, "", err
	}
	for _, n := range nodes {
		if n.MemAlarm {
			alarms = append(alarms, "memory on "+n.Name)
		}
		if n.DiskAlarm {
			alarms = append(alarms, "disk on "+n.Name)
		}
		if !n.Running {
			alarms = append(alarms, "node "+n.Name+" down")
		}
	}
	var ov struct {
		Version string `json:"rabbitmq_version"`
	}
	if err := a.get(ctx, "/api/overview", &ov); err == nil {
		version = ov.Version
	}
	return alarms, version, nil
}
