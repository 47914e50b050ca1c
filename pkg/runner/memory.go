package runner

import (
	"slices"
	"unsafe"
)

// copyRecord sets dst to a copy of src that shares no memory with it:
// Key, Value and the header keys and values in one new allocation (never
// reused, so a handler may keep the Record), the headers in another. A nil
// key, value or header value stays nil.
func copyRecord(dst, src *Record) {
	*dst = *src
	n := len(src.Key) + len(src.Value)
	for i := range src.Headers {
		n += len(src.Headers[i].Key) + len(src.Headers[i].Value)
	}
	var buf []byte
	if n > 0 {
		buf = slices.Grow([]byte(nil), n)
	}
	dst.Key, buf = cut(buf, src.Key)
	dst.Value, buf = cut(buf, src.Value)
	if src.Headers != nil {
		hs := make([]Header, len(src.Headers))
		for i, h := range src.Headers {
			var k []byte
			k, buf = cut(buf, unsafe.Slice(unsafe.StringData(h.Key), len(h.Key)))
			// Nothing writes buf after the copy: a string over it is as
			// immutable as any.
			hs[i].Key = unsafe.String(unsafe.SliceData(k), len(k))
			hs[i].Value, buf = cut(buf, h.Value)
		}
		dst.Headers = hs
	}
}

// emptyBytes backs the copies of empty, non-nil byte slices.
var emptyBytes [0]byte

// cut appends b to buf and returns the copy (nil for a nil b, capacity
// limited so that appending to it cannot overwrite what follows) and buf.
func cut(buf, b []byte) ([]byte, []byte) {
	if b == nil {
		return nil, buf
	}
	if len(b) == 0 {
		return emptyBytes[:], buf
	}
	k := len(buf)
	buf = append(buf, b...)
	return buf[k:len(buf):len(buf)], buf
}
