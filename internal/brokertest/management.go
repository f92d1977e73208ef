package brokertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	neturl "net/url"
	"strings"
	"testing"
	"time"
)

// QueueCounts asks the management API (port 15672 on the broker's host,
// which scripts/ensure-rabbitmq.sh enables) for the messages of queue in
// the virtual host of url: ready, delivered but not acknowledged, and
// acknowledged so far. The API refreshes them every few seconds, so tests
// wait for counts rather than read them.
func QueueCounts(t testing.TB, url, queue string) (ready, unacked, acked int) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatalf("queue counts: %v", err)
	}
	host, _, _ := strings.Cut(Host(), ":")
	vhost := strings.TrimPrefix(u.Path, "/")
	api := fmt.Sprintf("http://%s:15672/api/queues/%s/%s", host, neturl.PathEscape(vhost), neturl.PathEscape(queue))
	req, err := http.NewRequest(http.MethodGet, api, nil)
	if err != nil {
		t.Fatalf("queue counts: %v", err)
	}
	pass, _ := u.User.Password()
	req.SetBasicAuth(u.User.Username(), pass)
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("queue counts: the management API (rabbitmq-plugins enable rabbitmq_management): %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("queue counts of %s: %s", queue, resp.Status)
	}
	var q struct {
		Ready        int `json:"messages_ready"`
		Unacked      int `json:"messages_unacknowledged"`
		MessageStats struct {
			Ack int `json:"ack"`
		} `json:"message_stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		t.Fatalf("queue counts of %s: %v", queue, err)
	}
	return q.Ready, q.Unacked, q.MessageStats.Ack
}
