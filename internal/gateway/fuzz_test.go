package gateway

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientBytes is what a Ray Client-like client sends: the preface, SETTINGS, a request with auth, a
// message and the end of its stream.
func clientBytes(auth string) []byte {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 8192})
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ray.rpc.RayletDriver/Datapath"},
		{":authority", "svc-gw.ml:10001"}, {"content-type", "application/grpc"}, {"authorization", auth}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, false, frame([]byte("hello")))
	_ = fr.WriteWindowUpdate(0, 1000)
	_ = fr.WriteData(1, true, nil)
	_ = fr.WriteRSTStream(3, http2.ErrCodeCancel)
	return b.Bytes()
}

// FuzzRelay: whatever a client sends on the Ray Client port, the relay neither panics nor hangs once
// the client has gone.
func FuzzRelay(f *testing.F) {
	f.Add(clientBytes("Bearer " + string(clientCurrent)))
	f.Add(clientBytes("Bearer wrong"))
	f.Add([]byte(http2.ClientPreface))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add(append([]byte(http2.ClientPreface), 0, 0, 4, 1, 0x25, 0, 0, 0, 1, 0, 0, 0, 1))
	g := New(Options{ClientPort: 10001, Limits: Limits{HeaderTimeout: time.Second, IdleTimeout: time.Second},
		Dial: func(context.Context, string, string) (net.Conn, error) {
			head, gw := net.Pipe()
			go func() { _, _ = io.Copy(io.Discard, head); head.Close() }()
			return gw, nil
		}})
	g.SetTable(testTable())
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { g.newRelay(server).run(); close(done) }()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the relay still runs after its client went")
		}
	})
}
