package testproc

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that other goroutines or a child process write
// to while the test reads it: a logger's output, a process's standard
// output. Its zero value is ready to use.
type Buffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
