package api

import "google.golang.org/grpc"

// InProcess is a connection to this API's gRPC services without a network hop, for the
// dashboard (ui/): its calls go through the same authentication, validation and stores as
// any client's, with the signed-in operator's token in their metadata.
func (s *Server) InProcess() grpc.ClientConnInterface { return s.conn }
