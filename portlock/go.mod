module github.com/berth-go/berth/portlock

go 1.22
