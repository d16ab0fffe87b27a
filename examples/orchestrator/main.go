// Command orchestrator starts three small HTTP services that must find each
// other: api and auth, and web, which calls both. One port set spec gives
// each its port in its environment, and web the ports of the other two by
// reference. Each child owns its ports, so they stay reserved exactly as
// long as it runs, even if the orchestrator dies first: it inherits the
// kernel locks that hold them (Member.Files), and the store records it as
// their owner (Set.Transfer).
//
//	go run ./examples/orchestrator
//
// It waits until every service answers, prints who got what and web's
// answer, then stops the services and reaps their reservations.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/portset"
)

// spec is the system: three groups of one member each. web's refs put the
// other services' ports in its environment.
var spec = portset.SetSpec{
	Name: "demo",
	Groups: []portset.GroupSpec{
		{Name: "api", Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "auth", Ports: []portset.PortSpec{{Name: "http"}}},
		{Name: "web", Ports: []portset.PortSpec{{Name: "http"}}, Refs: []portset.RefSpec{
			{Env: "API_ADDR_PORT", To: "api.http"},
			{Env: "AUTH_ADDR_PORT", To: "auth.http"},
		}},
	},
}

const envService = "ORCHESTRATOR_SERVICE"

func main() {
	if name := os.Getenv(envService); name != "" {
		if err := serve(name); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	a, err := portalloc.New(ctx, portalloc.Config{})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	set, err := portset.Allocate(ctx, a, spec)
	if err != nil {
		return err
	}
	defer func() { _ = set.Release(context.WithoutCancel(ctx)) }()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var children []*exec.Cmd
	defer func() { stop(children) }()
	for _, m := range set.Members() {
		cmd := exec.Command(self)
		cmd.Env = append(append(os.Environ(), envService+"="+m.Group), m.Env()...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		locks, err := m.Files()
		if err != nil {
			return err
		}
		cmd.ExtraFiles = locks
		err = cmd.Start()
		for _, f := range locks {
			_ = f.Close() // the child has its copies
		}
		if err != nil {
			return err
		}
		children = append(children, cmd)
		// The child owns its port from now on.
		if err := set.Transfer(ctx, m, cmd.Process.Pid); err != nil {
			return err
		}
	}

	client := &http.Client{Timeout: 2 * time.Second}
	answers := map[string]string{}
	for _, m := range set.Members() {
		body, err := waitForAnswer(ctx, client, fmt.Sprintf("http://127.0.0.1:%d/", m.Ports["http"].Port))
		if err != nil {
			return fmt.Errorf("%s: %w", m.Group, err)
		}
		answers[m.Group] = body
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tPORT\tPID\tENVIRONMENT")
	for i, m := range set.Members() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", m.Group, m.Ports["http"].Port, children[i].Process.Pid, strings.Join(m.Env(), " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "web answered: %s\n", answers["web"])

	stop(children)
	children = nil
	n, err := a.Reap(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "stopped %d services; reaped %d reservations\n", len(set.Members()), n)
	return nil
}

func waitForAnswer(ctx context.Context, client *http.Client, url string) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return strings.TrimSpace(string(b)), nil
			}
			err = errors.Join(rerr, fmt.Errorf("status %s", resp.Status))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no answer from %s within 10s: %w", url, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop asks every child to end and waits for it.
func stop(children []*exec.Cmd) {
	for _, c := range children {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range children {
		_ = c.Wait()
	}
}

// serve is a service: it listens on the port in its environment. web calls
// api and auth at the ports its refs gave it.
func serve(name string) error {
	port := os.Getenv(strings.ToUpper(name) + "_HTTP_PORT")
	srv := &http.Server{Addr: "127.0.0.1:" + port, ReadHeaderTimeout: 5 * time.Second}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name != "web" {
			fmt.Fprintf(w, "%s ok\n", name)
			return
		}
		client := &http.Client{Timeout: 2 * time.Second}
		var parts []string
		for _, dep := range []string{"API", "AUTH"} {
			resp, err := client.Get("http://127.0.0.1:" + os.Getenv(dep+"_ADDR_PORT") + "/")
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			parts = append(parts, fmt.Sprintf("%s on :%s says %q", strings.ToLower(dep), os.Getenv(dep+"_ADDR_PORT"), strings.TrimSpace(string(b))))
		}
		fmt.Fprintf(w, "web on :%s reached %s\n", port, strings.Join(parts, " and "))
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
