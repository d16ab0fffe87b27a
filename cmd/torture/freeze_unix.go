//go:build unix

package main

import (
	"os"
	"syscall"
)

// freeze stops p where it stands (SIGSTOP cannot be caught), whatever lock it holds; thaw
// lets it go on (SIGCONT).
func freeze(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func thaw(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

const canFreeze = true
