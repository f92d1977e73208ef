package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", redactURL(amqpURL), err)
	}
	api := &managementAPI{user: uri.Username, pass: uri.Password, vhost: uri.Vhost, client: &http.Client{Timeout: 10 * time.Second}}
	if mgmtURL == "" {
		scheme, port := "http", 15672
		if uri.Scheme == "amqps" {
			scheme, port = "https", 15671
		}
		mgmtURL = scheme + "://" + net.JoinHostPort(uri.Host, strconv.Itoa(port))
	}
	u, err := neturl.Parse(mgmtURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("management URL %s: want http(s)://HOST:PORT", redactURL(mgmtURL))
	}
	if u.User != nil {
		api.user = u.User.Username()
		api.pass, _ = u.User.Password()
		u.User = nil
	}
	api.base = u
	return api, nil
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
