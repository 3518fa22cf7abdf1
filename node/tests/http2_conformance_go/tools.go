//go:build tools

// Package tools pins h2spec (an HTTP/2 conformance tester, RFC 7540/9113 and HPACK), which the
// RLS listener's conformance test builds with `go build github.com/summerwind/h2spec/cmd/h2spec`.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
