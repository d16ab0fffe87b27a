package main

import (
	"testing"
	"time"
)

func TestAge(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-300 * time.Second, "0s"}, // the clock was stepped back after the row was made
		{0, "0s"},
		{59 * time.Second, "59s"},
		{90 * time.Minute, "1h"},
		{50 * time.Hour, "2d"},
	} {
		if got := age(tt.d); got != tt.want {
			t.Errorf("age(%v) = %q; want %q", tt.d, got, tt.want)
		}
	}
}
