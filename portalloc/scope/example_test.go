package scope_test

import (
	"fmt"

	"github.com/berth-go/berth/portalloc/scope"
)

func ExampleResolve() {
	for _, s := range []string{"shop", "", "git:"} {
		sc, err := scope.Resolve(s)
		fmt.Printf("%q %v\n", sc, err != nil)
	}
	// Output:
	// "shop" false
	// "" false
	// "" true
}

func ExampleLabel() {
	recorded := scope.Label("shop", "web")
	fmt.Println(recorded)
	fmt.Println(scope.Unscoped(recorded, "shop"))
	fmt.Println(scope.Unscoped(recorded, "other"))
	// Output:
	// web@shop
	// web true
	//  false
}
