package live_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	"github.com/berth-go/berth/portalloc"
	"github.com/berth-go/berth/portalloc/live"
)

// Another program (a second shell, a script that writes docker compose's
// .env file) reads the ports that live processes hold, without taking
// them.
func ExamplePorts() {
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
	ports, err := live.Ports(ctx, s, "shop")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range ports {
		fmt.Println(p.Var, p.Port == r.Port)
	}
	web, err := live.PortOf(ctx, s, "shop", "web", portalloc.TCP)
	fmt.Println(web.Port == r.Port, err)
	_, err = live.PortOf(ctx, s, "shop", "db", portalloc.TCP)
	fmt.Println(err)
	// Output:
	// WEB_PORT true
	// true <nil>
	// portalloc: tcp port of "db" in scope "shop": no live reservation
}

func ExampleWriteEnv() {
	ports := []live.Port{
		{Var: "API_HTTP_PORT", Port: 23456, Addr: netip.MustParseAddr("127.0.0.1")},
		{Var: "WEB_PORT", Port: 24567, Addr: netip.MustParseAddr("127.0.0.1")},
	}
	for _, f := range []live.EnvFormat{live.EnvShell, live.EnvDotenv, live.EnvJSON} {
		if err := live.WriteEnv(os.Stdout, ports, f); err != nil {
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
		fmt.Println(live.EnvVar(l))
	}
	// Output:
	// WEB_PORT
	// API_HTTP_PORT
	// DEV_API_0_HTTP_PORT
	// _8080_PORT
}
