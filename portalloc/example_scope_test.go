package portalloc_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	"github.com/berth-go/berth/portalloc"
)

// Two checkouts of one project use the label "web" side by side: each
// Allocator has a scope of its own (in a program, usually
// portalloc.ScopeGit, the root of the git worktree it runs in), so each
// gets a port of its own, and the same one again after a restart.
func ExampleConfig_scope() {
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	web := func(scope string) (portalloc.Reservation, error) {
		a, err := portalloc.New(ctx, portalloc.Config{StateDir: dir, Range: portalloc.Range{First: 29000, Last: 29999}, Scope: scope})
		if err != nil {
			return portalloc.Reservation{}, err
		}
		defer a.Close() // releases the port: a restart
		return a.Allocate(ctx, portalloc.Request{Label: "web", Sticky: true})
	}
	main1, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	wt1, err := web("/src/shop-feature")
	if err != nil {
		fmt.Println(err)
		return
	}
	main2, err := web("/src/shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(main1.Label)
	fmt.Println("same port after a restart:", main1.Port == main2.Port)
	fmt.Println("other worktree, other port:", main1.Port != wt1.Port)
	// Output:
	// web@/src/shop
	// same port after a restart: true
	// other worktree, other port: true
}

func ExampleResolveScope() {
	for _, s := range []string{"shop", "", "git:"} {
		scope, err := portalloc.ResolveScope(s)
		fmt.Printf("%q %v\n", scope, err != nil)
	}
	// Output:
	// "shop" false
	// "" false
	// "" true
}

func ExampleScopedLabel() {
	recorded := portalloc.ScopedLabel("shop", "web")
	fmt.Println(recorded)
	fmt.Println(portalloc.UnscopedLabel(recorded, "shop"))
	fmt.Println(portalloc.UnscopedLabel(recorded, "other"))
	// Output:
	// web@shop
	// web true
	//  false
}

// Another program (a second shell, a script that writes docker compose's
// .env file) reads the ports that live processes hold, without taking
// them.
func ExampleLivePorts() {
	dir, err := os.MkdirTemp("", "berth-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	cfg := portalloc.Config{StateDir: dir, Range: portalloc.Range{First: 29000, Last: 29999}, Scope: "shop"}
	a, err := portalloc.New(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	r, err := a.Allocate(ctx, portalloc.Request{Label: "web"})
	if err != nil {
		fmt.Println(err)
		return
	}

	s, err := portalloc.OpenStore(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	ports, err := portalloc.LivePorts(ctx, s, "shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range ports {
		fmt.Println(p.Var, p.Port == r.Port)
	}
	web, err := portalloc.PortOf(ctx, s, "shop", "web", portalloc.TCP)
	fmt.Println(web.Port == r.Port, err)
	_, err = portalloc.PortOf(ctx, s, "shop", "db", portalloc.TCP)
	fmt.Println(err)
	// Output:
	// WEB_PORT true
	// true <nil>
	// portalloc: tcp port of "db" in scope "shop": no live reservation
}

func ExampleWriteEnv() {
	ports := []portalloc.LivePort{
		{Var: "API_HTTP_PORT", Port: 23456, Addr: netip.MustParseAddr("127.0.0.1")},
		{Var: "WEB_PORT", Port: 24567, Addr: netip.MustParseAddr("127.0.0.1")},
	}
	for _, f := range []portalloc.EnvFormat{portalloc.EnvShell, portalloc.EnvDotenv, portalloc.EnvJSON} {
		if err := portalloc.WriteEnv(os.Stdout, ports, f); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// export API_HTTP_PORT=23456
	// export WEB_PORT=24567
	// API_HTTP_PORT=23456
	// WEB_PORT=24567
	// {
	//   "API_HTTP_PORT": 23456,
	//   "WEB_PORT": 24567
	// }
}

func ExampleEnvVar() {
	for _, l := range []string{"run/port/web", "api.http", "dev/api/0/http", "8080"} {
		fmt.Println(portalloc.EnvVar(l))
	}
	// Output:
	// WEB_PORT
	// API_HTTP_PORT
	// DEV_API_0_HTTP_PORT
	// _8080_PORT
}
