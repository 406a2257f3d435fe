// Package api serves the admin API over gRPC and REST (grpc-gateway).
package api
