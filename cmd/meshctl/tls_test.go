package main

import (
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/brokertest"
)

// TestTLS: meshctl reaches an amqps:// broker whose certificate a private
// CA signed when --tls-ca-file names that CA, through the node it makes
// (emit) and through its own connection (dlq ls); without it, it fails
// and says which flag would help, without the password.
func TestTLS(t *testing.T) {
	url := brokertest.VHost(t)
	ca := brokertest.NewCA(t, "meshctl test CA")
	proxy := brokertest.NewTLSProxy(t, ca.ServerCert(t))
	tlsURL := strings.Replace(strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "amqp://", "amqps://", 1)
	bin := build(t)

	want(t, bin, tlsURL, 0, []string{"emit", "mesh.tls.ping", "{}", "--tls-ca-file", ca.File})
	want(t, bin, tlsURL, 0, []string{"dlq", "ls", "--tls-ca-file", ca.File}, "no dead letters")

	for _, args := range [][]string{{"emit", "mesh.tls.ping", "{}"}, {"dlq", "ls"}} {
		_, stderr, code := meshctl(t, bin, tlsURL, args...)
		if code != 1 || !strings.Contains(stderr, "certificate") {
			t.Errorf("meshctl %v without the CA exited %d: %s; want 1 and a certificate error", args, code, stderr)
		}
		if strings.Contains(stderr, "guest@") || strings.Contains(stderr, ":guest") {
			t.Errorf("meshctl %v shows the password: %s", args, stderr)
		}
	}
	for _, args := range [][]string{{"emit", "mesh.tls.ping", "{}"}, {"dlq", "ls"}} {
		if _, stderr, _ := meshctl(t, bin, tlsURL, args...); !strings.Contains(stderr, "--tls-ca-file") {
			t.Errorf("meshctl %v: the refusal does not say which flag would help: %s", args, stderr)
		}
	}
}
