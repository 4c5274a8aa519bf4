//go:build linux

package volume

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyFileRange is unix.CopyFileRange; tests replace it to exercise the fallback.
var copyFileRange = unix.CopyFileRange

// extent is a range of a sparse file that holds data.
type extent struct{ off, len int64 }

// dataExtents lists the data ranges of f (SEEK_DATA/SEEK_HOLE): everything else is a
// hole and reads as zeros.
func dataExtents(f *os.File) ([]extent, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	fd := int(f.Fd())
	var out []extent
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data past off
			break
		}
		if err != nil {
			return nil, fmt.Errorf("seek data in %s at %d: %w", f.Name(), off, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole in %s at %d: %w", f.Name(), data, err)
		}
		out = append(out, extent{data, hole - data})
		off = hole
	}
	return out, nil
}

// nonZero narrows ext to the 4 KiB blocks of f that hold something other than zeros:
// mkfs writes zeroed ranges too, and every range copied is an extent the host's
// filesystem must allocate for each volume and free again when it is deleted.
func nonZero(f *os.File, ext []extent) ([]extent, error) {
	const bs = 4096
	var out []extent
	buf := make([]byte, bs)
	for _, e := range ext {
		for off := e.off; off < e.off+e.len; off += bs {
			n := min(bs, e.off+e.len-off)
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				return nil, fmt.Errorf("read %s at %d: %w", f.Name(), off, err)
			}
			if allZero(buf[:n]) {
				continue
			}
			if k := len(out) - 1; k >= 0 && out[k].off+out[k].len == off {
				out[k].len += n
			} else {
				out = append(out, extent{off, n})
			}
		}
	}
	return out, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// copyExtents makes dst a sparse copy of src, size bytes long with data only at ext.
// copy_file_range does the copying in the kernel (a reflink on filesystems that share
// blocks); a plain read and write serves where it cannot.
func copyExtents(dst, src *os.File, ext []extent, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	var buf []byte
	for _, e := range ext {
		roff, woff, left := e.off, e.off, e.len
		for left > 0 {
			n, err := copyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(left), 0)
			if err == nil && n > 0 {
				left -= int64(n)
				continue
			}
			if err == nil { // n == 0: src shorter than it was
				return fmt.Errorf("copy %s: unexpected end at %d", src.Name(), roff)
			}
			if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("copy %s to %s at %d: %w", src.Name(), dst.Name(), roff, err)
			}
			if buf == nil {
				buf = make([]byte, 1<<20)
			}
			n64, err := io.CopyBuffer(io.NewOffsetWriter(dst, woff), io.NewSectionReader(src, roff, left), buf)
			if err == nil && n64 < left {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return fmt.Errorf("copy %s to %s at %d: %w", src.Name(), dst.Name(), roff, err)
			}
			roff, woff, left = roff+n64, woff+n64, left-n64
		}
	}
	return nil
}
