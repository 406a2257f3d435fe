// Package proto holds the .proto sources of the admin API and the Go generated from them.
package proto
