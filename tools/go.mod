module github.com/pgleader/pgleader/tools

go 1.25.0

require (
	github.com/pgleader/pgleader v0.0.0-20261201173658-2af76a84efad
	golang.org/x/mod v0.39.0
)
