package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"testing"

	"golang.org/x/net/http2"
)

// BenchmarkRelayDataPath: what the relay's data path costs per byte against http2.Framer doing the
// same job (issue 35, item 10), on the same in-memory stream of DATA frames (payloads of one size, a
// WINDOW_UPDATE every 8 frames), read from the same buffer size the relay uses and written to a sink:
//
//   - "runs": the relay's fast path, runOfFrames + writeRun (frames that pass unchanged are measured in
//     the read buffer and written from it in one call, never parsed into a frame or copied);
//   - "framer": ReadFrame with SetReuseFrames, then WriteData / WriteWindowUpdate, as a Framer-based
//     relay would forward each frame (the payload is copied into the Framer's write buffer).
//
// Numbers: BENCHMARKS.md (the gateway section).
func BenchmarkRelayDataPath(b *testing.B) {
	for _, size := range []int{64, 1 << 10, 16 << 10} {
		stream := dataStream(size, 512)
		b.Run(fmt.Sprintf("payload=%d/runs", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			src := bytes.NewReader(stream)
			br := bufio.NewReaderSize(src, relayBuffer)
			passable := func(h frameHeader) bool { return h.typ == frameData || h.typ == frameWindowUpdate }
			for b.Loop() {
				src.Reset(stream)
				br.Reset(src)
				var sink countingWriter
				for {
					n, _, err := runOfFrames(br, passable)
					if err == io.EOF {
						break
					} else if err != nil || n == 0 {
						b.Fatalf("run: %d, %v", n, err)
					}
					if err := writeRun(&sink, br, n); err != nil {
						b.Fatal(err)
					}
				}
				if int(sink) != len(stream) {
					b.Fatalf("forwarded %d of %d bytes", sink, len(stream))
				}
			}
		})
		b.Run(fmt.Sprintf("payload=%d/framer", size), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			src := bytes.NewReader(stream)
			br := bufio.NewReaderSize(src, relayBuffer)
			var sink countingWriter
			bw := bufio.NewWriterSize(&sink, relayWriteBuffer)
			for b.Loop() {
				src.Reset(stream)
				br.Reset(src)
				sink = 0
				fr := http2.NewFramer(bw, br)
				fr.SetReuseFrames()
				for {
					f, err := fr.ReadFrame()
					if err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
					switch f := f.(type) {
					case *http2.DataFrame:
						err = fr.WriteData(f.StreamID, f.StreamEnded(), f.Data())
					case *http2.WindowUpdateFrame:
						err = fr.WriteWindowUpdate(f.StreamID, f.Increment)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if err := bw.Flush(); err != nil {
					b.Fatal(err)
				}
				if int(sink) != len(stream) {
					b.Fatalf("forwarded %d of %d bytes", sink, len(stream))
				}
			}
		})
	}
}

// dataStream is n DATA frames of size bytes on stream 1, with a WINDOW_UPDATE after every eighth.
func dataStream(size, n int) []byte {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	payload := bytes.Repeat([]byte{'x'}, size)
	for i := range n {
		_ = fr.WriteData(1, false, payload)
		if i%8 == 7 {
			_ = fr.WriteWindowUpdate(1, uint32(8*size))
		}
	}
	return buf.Bytes()
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
