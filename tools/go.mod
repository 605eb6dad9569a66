module github.com/pgleader/pgleader/tools

go 1.25.0

require golang.org/x/mod v0.39.0
