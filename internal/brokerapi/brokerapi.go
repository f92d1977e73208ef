// Package brokerapi is the small part of RabbitMQ's management API (the
// rabbitmq_management plugin's HTTP API) that the node and meshctl need to
// keep queue settings in policies and to move a queue: who the user is,
// a queue's arguments and policy, a queue's bindings, and policies.
//
// It speaks for one virtual host, the broker URL's, with the broker URL's
// user. Errors wrap ErrUnavailable when the API does not answer as one
// (the plugin is off, the URL is wrong, the user has no management tag),
// and ErrNotFound when what was asked for does not exist.
package brokerapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrUnavailable is wrapped by errors of an API that does not answer as
// the management API: the plugin is off, the URL is wrong, or the user
// may not use it.
var ErrUnavailable = errors.New("the management API does not answer")

// ErrNotFound is wrapped by errors about an object that does not exist.
var ErrNotFound = errors.New("not found")

// ErrManagementURL is Endpoint's error for a management URL that is not
// http(s)://HOST:PORT.
var ErrManagementURL = errors.New("management URL: want http(s)://HOST:PORT")

// ErrRefused is wrapped by errors of a request the broker refused for the
// user's rights (401 or 403).
var ErrRefused = errors.New("refused")

// Client is the management API of one broker, for the virtual host and
// user of a broker URL.
type Client struct {
	base       *neturl.URL
	user, pass string
	vhost      string
	http       *http.Client
}

// Endpoint is where the management API of the broker at amqpURL answers
// (scheme and host, without credentials), and as whom: mgmtURL if it is
// not empty, else the AMQP host at port 15672 (http), or 15671 (https) for
// an amqps:// broker; the user and password are amqpURL's unless mgmtURL
// names its own. vhost is amqpURL's virtual host. Its error is
// amqp.ParseURI's for a bad amqpURL, ErrManagementURL for a bad mgmtURL.
func Endpoint(amqpURL, mgmtURL string) (base *neturl.URL, user, pass, vhost string, err error) {
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		return nil, "", "", "", err
	}
	if mgmtURL == "" {
		scheme, port := "http", 15672
		if uri.Scheme == "amqps" {
			scheme, port = "https", 15671
		}
		mgmtURL = scheme + "://" + net.JoinHostPort(uri.Host, strconv.Itoa(port))
	}
	u, err := neturl.Parse(mgmtURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", "", "", ErrManagementURL
	}
	user, pass = uri.Username, uri.Password
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
		u.User = nil
	}
	u.Path, u.RawPath = "", ""
	return u, user, pass, uri.Vhost, nil
}

// New is the management API of the broker at amqpURL, at Endpoint's
// address, over TLS with tc for https.
func New(amqpURL, mgmtURL string, tc *tls.Config) (*Client, error) {
	base, user, pass, vhost, err := Endpoint(amqpURL, mgmtURL)
	switch {
	case errors.Is(err, ErrManagementURL):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("broker URL: %w", err)
	}
	c := &Client{base: base, user: user, pass: pass, vhost: vhost}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		transport.TLSClientConfig = tc
	}
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: transport}
	return c, nil
}

// VHost is the virtual host the client speaks for.
func (c *Client) VHost() string { return c.vhost }

// URL is the API's address (without credentials), for messages.
func (c *Client) URL() string { return c.base.String() }

// do sends a request to path (parts escaped here and joined by /) with
// body in JSON if not nil, and reads the answer into v if not nil.
func (c *Client) do(ctx context.Context, method string, body, v any, parts ...string) error {
	path := "/api"
	for _, p := range parts {
		path += "/" + neturl.PathEscape(p)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(c.user, c.pass)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%w at %s: %v", ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnavailable, c.base, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s %s: %w", method, path, ErrNotFound)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s %s as user %q: %s: %w", method, path, c.user, resp.Status, ErrRefused)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("%s %s: %s %s", method, path, resp.Status, bytes.TrimSpace(data[:min(len(data), 300)]))
	}
	if v == nil || len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w at %s: %s: %v", ErrUnavailable, c.base, path, err)
	}
	return nil
}

// Tags are the user's tags (administrator, policymaker, management...).
func (c *Client) Tags(ctx context.Context) ([]string, error) {
	var who struct {
		Tags json.RawMessage `json:"tags"`
	}
	if err := c.do(ctx, http.MethodGet, nil, &who, "whoami"); err != nil {
		return nil, err
	}
	// A list since RabbitMQ 3.9; a comma-separated string before.
	var tags []string
	if err := json.Unmarshal(who.Tags, &tags); err == nil {
		return tags, nil
	}
	var s string
	if err := json.Unmarshal(who.Tags, &s); err != nil {
		return nil, fmt.Errorf("whoami: tags %s: %w", who.Tags, err)
	}
	for _, t := range bytes.Split([]byte(s), []byte(",")) {
		if t = bytes.TrimSpace(t); len(t) > 0 {
			tags = append(tags, string(t))
		}
	}
	return tags, nil
}

// ClusterName is the broker's cluster name (as its AMQP connections'
// server properties say it, cluster_name), which tells whether the API is
// the same broker's as a connection.
func (c *Client) ClusterName(ctx context.Context) (string, error) {
	var ov struct {
		ClusterName string `json:"cluster_name"`
	}
	err := c.do(ctx, http.MethodGet, nil, &ov, "overview")
	return ov.ClusterName, err
}

// CanSetPolicies says whether the user may set policies: it has the
// policymaker or the administrator tag.
func (c *Client) CanSetPolicies(ctx context.Context) (bool, error) {
	tags, err := c.Tags(ctx)
	if err != nil {
		return false, err
	}
	return slices.Contains(tags, "policymaker") || slices.Contains(tags, "administrator"), nil
}

// Queue is a queue as the management API shows it.
type Queue struct {
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	Durable   bool           `json:"durable"`
	Arguments map[string]any `json:"arguments"`
	// Policy is the name of the policy that applies to it, if any.
	Policy string `json:"policy"`
	// OperatorPolicy is the name of the operator policy that applies.
	OperatorPolicy string `json:"operator_policy"`
	// Effective is the settings the policies give it, merged.
	Effective map[string]any `json:"effective_policy_definition"`
	Consumers int            `json:"consumers"`
	Messages  int            `json:"messages"`
}

// IntArgument is the queue's argument key as an integer, and whether it
// has it.
func (q Queue) IntArgument(key string) (int64, bool) {
	switch v := q.Arguments[key].(type) {
	case float64:
		return int64(v), true
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// Queue reads queue; its error wraps ErrNotFound if it does not exist.
func (c *Client) Queue(ctx context.Context, queue string) (Queue, error) {
	var q Queue
	err := c.do(ctx, http.MethodGet, nil, &q, "queues", c.vhost, queue)
	return q, err
}

// Queues lists the virtual host's queues. Their message and consumer
// counts are the API's statistics, a few seconds old.
func (c *Client) Queues(ctx context.Context) ([]Queue, error) {
	var qs []Queue
	err := c.do(ctx, http.MethodGet, nil, &qs, "queues", c.vhost)
	return qs, err
}

// Binding is one binding of a queue: from Exchange with Key.
type Binding struct {
	Exchange string
	Key      string
}

// Bindings are queue's bindings, the default exchange's left out (every
// queue has it); its error wraps ErrNotFound if the queue does not exist.
func (c *Client) Bindings(ctx context.Context, queue string) ([]Binding, error) {
	var raw []struct {
		Source          string `json:"source"`
		RoutingKey      string `json:"routing_key"`
		DestinationType string `json:"destination_type"`
	}
	if err := c.do(ctx, http.MethodGet, nil, &raw, "queues", c.vhost, queue, "bindings"); err != nil {
		return nil, err
	}
	var bs []Binding
	for _, b := range raw {
		if b.Source != "" && b.DestinationType == "queue" {
			bs = append(bs, Binding{Exchange: b.Source, Key: b.RoutingKey})
		}
	}
	return bs, nil
}

// Policy is a policy of the virtual host.
type Policy struct {
	Name       string         `json:"name,omitempty"`
	Pattern    string         `json:"pattern"`
	ApplyTo    string         `json:"apply-to"`
	Priority   int            `json:"priority"`
	Definition map[string]any `json:"definition"`
}

// PutPolicy sets policy p (by p.Name), replacing one of that name.
func (c *Client) PutPolicy(ctx context.Context, p Policy) error {
	name := p.Name
	p.Name = ""
	if err := c.do(ctx, http.MethodPut, p, nil, "policies", c.vhost, name); err != nil {
		return fmt.Errorf("set policy %s: %w", name, err)
	}
	return nil
}

// Policy reads the policy name; its error wraps ErrNotFound if there is
// none.
func (c *Client) Policy(ctx context.Context, name string) (Policy, error) {
	var p Policy
	err := c.do(ctx, http.MethodGet, nil, &p, "policies", c.vhost, name)
	return p, err
}

// DeletePolicy deletes the policy name; one that does not exist is not an
// error.
func (c *Client) DeletePolicy(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, nil, nil, "policies", c.vhost, name); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("delete policy %s: %w", name, err)
	}
	return nil
}
