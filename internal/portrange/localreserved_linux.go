package portrange

import (
	"errors"
	"fmt"
	"os"
)

func localReserved() ([]Range, error) {
	b, err := os.ReadFile(LocalReservedFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // a kernel without the sysctl (before 2.6.35), or no /proc
	}
	if err != nil {
		return nil, fmt.Errorf("portrange: %w", err)
	}
	return parseLocalReserved(string(b))
}
