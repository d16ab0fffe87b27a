//go:build !linux

package owner

// scope is empty where the OS has neither a boot id nor pid namespaces.
func scope() string { return "" }
