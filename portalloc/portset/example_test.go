package portset_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-go/berth/portalloc/portset"
)

// A set wires services together: each member gets its own ports and the
// variables that point at the others'.
func ExampleAllocate() {
	a, done := exampleAllocator(26800)
	defer done()
	ctx := context.Background()

	set, err := portset.Allocate(ctx, a, portset.SetSpec{
		Name: "shop",
		Groups: []portset.GroupSpec{
			{Name: "db", Ports: []portset.PortSpec{{Name: "sql"}}},
			{
				Name: "api", Members: 2,
				Ports: []portset.PortSpec{{Name: "http"}},
				Refs:  []portset.RefSpec{{Env: "DATABASE_PORT", To: "db.sql"}},
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = set.Release(ctx) }()

	db := set.Members()[0].Ports["sql"].Port
	for _, m := range set.Members() {
		var names []string
		for _, kv := range m.Env() {
			name, value, _ := strings.Cut(kv, "=")
			if name == "DATABASE_PORT" && value == strconv.Itoa(int(db)) {
				name += "=<db.sql>"
			}
			names = append(names, name)
		}
		slices.Sort(names)
		fmt.Println(m.Group, m.Index, names)
	}
	// Output:
	// db 0 [DB_SQL_PORT]
	// api 0 [API_HTTP_PORT DATABASE_PORT=<db.sql>]
	// api 1 [API_HTTP_PORT DATABASE_PORT=<db.sql>]
}

// Each member of a group gets one variable per port of its group and one
// per reference. A port's is <GROUP>_<PORT>_PORT, upper case with '-' as
// '_', unless its Env names it; a reference's is its Env exactly, with
// nothing added.
func ExampleGroupSpec_EnvNames() {
	web := portset.GroupSpec{
		Name: "web",
		Ports: []portset.PortSpec{
			{Name: "http"},
			{Name: "http-admin"},
			{Name: "metrics", Env: "METRICS_PORT"},
		},
		Refs: []portset.RefSpec{{Env: "API_GRPC", To: "api.grpc"}},
	}
	fmt.Println(web.EnvNames())
	// Output: [WEB_HTTP_PORT WEB_HTTP_ADMIN_PORT METRICS_PORT API_GRPC]
}

// Two groups that each give their port as $PORT are a valid spec when
// each member runs with its own Member.Env; in one environment (berth run
// --set) the two would collide.
func ExampleSetSpec_ValidateOneEnv() {
	spec := portset.SetSpec{Name: "dev", Groups: []portset.GroupSpec{
		{Name: "api", Ports: []portset.PortSpec{{Name: "http", Env: "PORT"}}},
		{Name: "web", Ports: []portset.PortSpec{{Name: "http", Env: "PORT"}}},
	}}
	fmt.Println(spec.Validate())
	fmt.Println(spec.ValidateOneEnv())
	// Output:
	// <nil>
	// portalloc: SetSpec "PORT" at groups[1].ports[0]: want a variable that stands for one port in one environment; $PORT would be port web.http here and port api.http by groups[0].ports[0]: give them different names
}
