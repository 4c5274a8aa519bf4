//go:build unix

package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk/pdktest"
)

func TestGuardedWrites(t *testing.T) {
	w := pdktest.New(t)
	w.Write("a.txt", "one\ntwo\n")
	edit := `{"path":"a.txt","old_string":"two","new_string":"2"}`
	if got, isErr := w.Call("edit_file", edit); !isErr || !strings.Contains(got, "a.txt has not been read in this session") {
		t.Errorf("unread: %v %q", isErr, got)
	}
	if got, isErr := w.Call("write_file", `{"path":"a.txt","content":"x"}`); !isErr || !strings.Contains(got, "cannot be overwritten unseen") {
		t.Errorf("overwrite unread: %v %q", isErr, got)
	}
	w.Call("read_file", `{"path":"a.txt","limit":1}`) // a partial view counts
	if got, isErr := w.Call("edit_file", edit); isErr {
		t.Fatalf("after read: %q", got)
	}
	// Its own edit keeps the record current: a second edit needs no new read.
	if got, isErr := w.Call("edit_file", `{"path":"a.txt","old_string":"one","new_string":"1"}`); isErr {
		t.Fatalf("second edit: %q", got)
	}
	// Something else changes the file: refused until read again.
	os.WriteFile(filepath.Join(w.Root, "a.txt"), []byte("1\n2\nthree\n"), 0o644)
	if got, isErr := w.Call("edit_file", `{"path":"a.txt","old_string":"three","new_string":"3"}`); !isErr || !strings.Contains(got, "has changed since you last read it") {
		t.Errorf("changed: %v %q", isErr, got)
	}
	w.Call("read_file", `{"path":"a.txt"}`)
	if got, isErr := w.Call("edit_file", `{"path":"a.txt","old_string":"three","new_string":"3"}`); isErr {
		t.Errorf("after reading again: %q", got)
	}
	// A new file is never refused, and what write_file wrote may be written again.
	if got, isErr := w.Call("write_file", `{"path":"new/b.txt","content":"b"}`); isErr {
		t.Errorf("new file: %q", got)
	}
	if got, isErr := w.Call("write_file", `{"path":"new/b.txt","content":"bb"}`); isErr {
		t.Errorf("rewrite of its own: %q", got)
	}
	// The embedder can turn it off.
	t.Setenv("TOOLHOST_EDITFILE_GUARD", "off")
	w.Write("c.txt", "c\n")
	if got, isErr := w.Call("edit_file", `{"path":"c.txt","old_string":"c","new_string":"C"}`); isErr {
		t.Errorf("guard off: %q", got)
	}
}

const patchAll = `*** Begin Patch
*** Add File: docs/new.md
+# New
+
+text
*** Delete File: old.txt
*** Update File: src/main.go
@@ func main() {
 	a := 1
-	b := 2
+	b := 3
 	fmt.Println(a, b)
@@
 	return
-}
+} // end
*** Update File: src/util.go
*** Move to: src/helpers.go
@@
-func util() {}
+func helper() {}
*** End Patch
`

func TestApplyPatch(t *testing.T) {
	w := pdktest.New(t)
	w.Write("old.txt", "bye\n")
	w.Write("src/main.go", "package main\n\nfunc main() {\n\ta := 1\n\tb := 2\n\tfmt.Println(a, b)\n\treturn\n}\n")
	w.Write("src/util.go", "package main\n\nfunc util() {}\n")
	got, isErr := w.Call("apply_patch", `{"input":`+quote(patchAll)+`}`)
	if isErr || got != "Success. Updated the following files:\nA docs/new.md\nD old.txt\nM src/main.go\nR src/util.go -> src/helpers.go" {
		t.Fatalf("apply: %v %q", isErr, got)
	}
	if s := w.Read("docs/new.md"); s != "# New\n\ntext\n" {
		t.Errorf("added: %q", s)
	}
	if s := w.Read("src/main.go"); s != "package main\n\nfunc main() {\n\ta := 1\n\tb := 3\n\tfmt.Println(a, b)\n\treturn\n} // end\n" {
		t.Errorf("updated: %q", s)
	}
	if s := w.Read("src/helpers.go"); s != "package main\n\nfunc helper() {}\n" {
		t.Errorf("moved: %q", s)
	}
	for _, gone := range []string{"old.txt", "src/util.go"} {
		if _, err := os.Stat(filepath.Join(w.Root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still exists", gone)
		}
	}
	// What apply_patch wrote, edit_file may change without a read.
	if got, isErr := w.Call("edit_file", `{"path":"src/main.go","old_string":"b := 3","new_string":"b := 4"}`); isErr {
		t.Errorf("edit after patch: %q", got)
	}
}

// A hunk that does not apply leaves every file as it was, names the hunk and shows the
// lines it looked for and where the file comes closest.
func TestApplyPatchAllOrNothing(t *testing.T) {
	w := pdktest.New(t)
	w.Write("a.txt", "alpha\nbeta\n")
	w.Write("b.py", "def f():\n    return 1\n\ndef g():\n    return 2\n")
	patch := `*** Begin Patch
*** Update File: a.txt
@@
-alpha
+ALPHA
*** Add File: c.txt
+new
*** Update File: b.py
@@ def g():
-    return 3
+    return 4
*** End Patch`
	got, isErr := w.Call("apply_patch", `{"input":`+quote(patch)+`}`)
	for _, want := range []string{"hunk 1 of b.py (@@ def g():) did not apply", "\n    -    return 3\n", "closest part of the file (lines", "     5\t    return 2", "No file was changed"} {
		if !isErr || !strings.Contains(got, want) {
			t.Errorf("failing hunk: %v, %q does not say %q", isErr, got, want)
		}
	}
	if s := w.Read("a.txt"); s != "alpha\nbeta\n" {
		t.Errorf("a.txt was changed: %q", s)
	}
	if _, err := os.Stat(filepath.Join(w.Root, "c.txt")); !os.IsNotExist(err) {
		t.Error("c.txt was created")
	}
	// Whitespace the model got wrong at the ends of lines still matches, as in Codex.
	got, isErr = w.Call("apply_patch", `{"input":`+quote("*** Begin Patch\n*** Update File: b.py\n@@\n def g():  \n-  return 2\n+    return 5\n*** End Patch")+`}`)
	if isErr || !strings.Contains(w.Read("b.py"), "return 5") {
		t.Errorf("fuzzy: %v %q", isErr, got)
	}
	// Malformed patches say where.
	for patch, want := range map[string]string{
		"*** Update File: a.txt\n@@\n-alpha\n*** End Patch":                              "must start with the line *** Begin Patch",
		"*** Begin Patch\n*** Frobnicate: a.txt\n*** End Patch":                          "line 2 of the patch: expected *** Add File:",
		"*** Begin Patch\n*** Update File: a.txt\n@@\n?alpha\n*** End Patch":             "line 4 of the patch: a hunk line must start with",
		"*** Begin Patch\n*** Delete File: nope.txt\n*** End Patch":                      "Delete File nope.txt: no such file or directory",
		"*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch":                        "a.txt has not been read in this session",
		"*** Begin Patch\n*** Delete File: a.txt\n*** Delete File: a.txt\n*** End Patch": "changes a.txt twice",
	} {
		if got, isErr := w.Call("apply_patch", `{"input":`+quote(patch)+`}`); !isErr || !strings.Contains(got, want) {
			t.Errorf("%q: %v %q, want %q", patch, isErr, got, want)
		}
	}
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func testPNG(t *testing.T, w, h int) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			i := img.PixOffset(x, y)
			copy(img.Pix[i:i+4], []uint8{uint8(x * 7), uint8(y * 13), uint8((x ^ y) * 3), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestReadImages(t *testing.T) {
	w := pdktest.New(t)
	small := testPNG(t, 64, 40)
	w.Write("small.png", string(small))
	r := w.Result("read_file", `{"path":"small.png"}`)
	if r.IsError || len(r.Content) != 2 || r.Content[1].Source.MediaType != "image/png" || !strings.Contains(r.Content[0].Text, "PNG, 64x40") {
		t.Fatalf("small: %+v", r)
	}
	if d, _ := base64.StdEncoding.DecodeString(r.Content[1].Source.Data); !bytes.Equal(d, small) {
		t.Error("a small image was not passed through as it is")
	}
	w.Write("wide.png", string(testPNG(t, 1600, 40)))
	w.Write("noext", string(testPNG(t, 40, 1600)))
	for path, want := range map[string]image.Point{"wide.png": {1568, 39}, "noext": {39, 1568}} {
		r = w.Result("read_file", `{"path":"`+path+`"}`)
		if r.IsError || len(r.Content) != 2 {
			t.Fatalf("%s: %+v", path, r)
		}
		img := decodeImage(t, r.Content[1])
		if b := img.Bounds(); b.Size() != want {
			t.Errorf("%s: shown at %v, want %v", path, b.Size(), want)
		}
		if !strings.Contains(r.Content[0].Text, "; shown at "+dims(want.X, want.Y)) {
			t.Errorf("%s: %q", path, r.Content[0].Text)
		}
	}
	w.Write("bad.png", "\x89PNG\r\n\x1a\nnot really")
	if got, isErr := w.Call("read_file", `{"path":"bad.png"}`); !isErr || !strings.Contains(got, "not an image read_file can decode") {
		t.Errorf("bad png: %v %q", isErr, got)
	}
}

func decodeImage(t *testing.T, c abi.Content) image.Image {
	t.Helper()
	data, err := base64.StdEncoding.DecodeString(c.Source.Data)
	if err != nil {
		t.Fatal(err)
	}
	var img image.Image
	switch c.Source.MediaType {
	case "image/webp":
		img, err = webp.Decode(bytes.NewReader(data))
	default:
		img, _, err = image.Decode(bytes.NewReader(data))
	}
	if err != nil {
		t.Fatalf("%s does not decode: %v", c.Source.MediaType, err)
	}
	return img
}

func TestReadNotebook(t *testing.T) {
	w := pdktest.New(t)
	pngB64 := base64.StdEncoding.EncodeToString(testPNG(t, 10, 10))
	nb := `{"cells": [
 {"cell_type": "markdown", "source": ["# Title\n", "some text"], "metadata": {}},
 {"cell_type": "code", "execution_count": 3, "source": "print(1+1)", "outputs": [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}]},
 {"cell_type": "code", "execution_count": 4, "source": ["plot()"], "outputs": [{"output_type": "display_data", "data": {"image/png": "` + pngB64 + `", "text/plain": ["<Figure>"]}}]},
 {"cell_type": "code", "execution_count": 5, "source": "1/0", "outputs": [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["\u001b[0;31mZeroDivisionError\u001b[0m: division by zero"]}]}
], "metadata": {"kernelspec": {"language": "python"}}, "nbformat": 4, "nbformat_minor": 5}`
	w.Write("a.ipynb", nb)
	r := w.Result("read_file", `{"path":"a.ipynb"}`)
	var text strings.Builder
	images := 0
	for _, c := range r.Content {
		if c.Type == abi.ContentImage {
			images++
			decodeImage(t, c)
		}
		text.WriteString(c.Text)
	}
	for _, want := range []string{"[notebook a.ipynb: 4 cells, python]", "--- cell 1 (markdown) ---\n# Title\nsome text",
		"--- cell 2 (code, [3]) ---\nprint(1+1)\n--- output (stdout) ---\n2", "--- output (image/png) ---",
		"--- error: ZeroDivisionError: division by zero ---\nZeroDivisionError: division by zero"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("notebook text lacks %q:\n%s", want, text.String())
		}
	}
	if r.IsError || images != 1 {
		t.Errorf("notebook: is_error %v, %d images", r.IsError, images)
	}
}

func TestReadPDF(t *testing.T) {
	if _, err := exec.LookPath("pdftotext"); err != nil {
		t.Skip("poppler-utils is not installed (scripts/setup.sh installs it)")
	}
	w := pdktest.New(t)
	w.Write("doc.pdf", string(twoPagePDF()))
	got, isErr := w.Call("read_file", `{"path":"doc.pdf"}`)
	for _, want := range []string{"[PDF doc.pdf: 2 pages; pages 1-2 as text]", "--- page 1 ---\nHello from page one", "--- page 2 ---\nAnd page two"} {
		if isErr || !strings.Contains(got, want) {
			t.Errorf("pdf: %v %q lacks %q", isErr, got, want)
		}
	}
	got, _ = w.Call("read_file", `{"path":"doc.pdf","pages":"2"}`)
	if strings.Contains(got, "page one") || !strings.Contains(got, "And page two") {
		t.Errorf("page 2: %q", got)
	}
	if got, isErr := w.Call("read_file", `{"path":"doc.pdf","pages":"3"}`); !isErr || !strings.Contains(got, "which has 2 pages") {
		t.Errorf("page 3: %v %q", isErr, got)
	}
	r := w.Result("read_file", `{"path":"doc.pdf","pages":"1-2","pages_as_images":true}`)
	n := 0
	for _, c := range r.Content {
		if c.Type == abi.ContentImage {
			n++
			if b := decodeImage(t, c).Bounds(); max(b.Dx(), b.Dy()) != 1568 {
				t.Errorf("page image %v", b)
			}
		}
	}
	if r.IsError || n != 2 {
		t.Errorf("pages as images: %v, %d images", r.IsError, n)
	}
}

// twoPagePDF writes a minimal PDF of two pages, each with one line of text.
func twoPagePDF() []byte {
	objs := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R 5 0 R] /Count 2 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R /Resources << /Font << /F1 7 0 R >> >> >>",
		stream("BT /F1 18 Tf 20 100 Td (Hello from page one) Tj ET"),
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 6 0 R /Resources << /Font << /F1 7 0 R >> >> >>",
		stream("BT /F1 18 Tf 20 100 Td (And page two) Tj ET"),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
	}
	var b bytes.Buffer
	b.WriteString("%PDF-1.4\n")
	offsets := make([]int, len(objs))
	for i, o := range objs {
		offsets[i] = b.Len()
		b.WriteString(itoa(i+1) + " 0 obj\n" + o + "\nendobj\n")
	}
	xref := b.Len()
	b.WriteString("xref\n0 " + itoa(len(objs)+1) + "\n0000000000 65535 f \n")
	for _, off := range offsets {
		s := itoa(off)
		b.WriteString(strings.Repeat("0", 10-len(s)) + s + " 00000 n \n")
	}
	b.WriteString("trailer\n<< /Size " + itoa(len(objs)+1) + " /Root 1 0 R >>\nstartxref\n" + itoa(xref) + "\n%%EOF\n")
	return b.Bytes()
}

func stream(s string) string {
	return "<< /Length " + itoa(len(s)) + " >>\nstream\n" + s + "\nendstream"
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestEncodeSmallestNoise: an image of noise, which makes the lossless WebP encoder panic,
// still comes back, as PNG.
func TestEncodeSmallestNoise(t *testing.T) {
	img := image.NewNRGBA(image.Rect(0, 0, 1568, 165))
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = uint8(r.Uint32()), uint8(r.Uint32()), uint8(r.Uint32()), 255
	}
	out, mt := encodeSmallest(img, false, 1<<40)
	t.Logf("encoded as %s, %d bytes", mt, len(out))
	if mt == "image/webp" {
		return // the encoder coped: nothing to fall back from
	}
	if mt != "image/png" {
		t.Fatalf("media type %s, want image/png", mt)
	}
	got, err := png.Decode(bytes.NewReader(out))
	if err != nil || got.Bounds() != img.Bounds() {
		t.Fatalf("the fallback PNG: %v, %v", err, got)
	}
}

// TestDecodeMemory: the estimate of what decoding takes follows what the decoders
// allocate: the pixel format of a PNG (and its tRNS, and Adam7), a JPEG's components,
// subsampling and progressive coefficients.
func TestDecodeMemory(t *testing.T) {
	est := func(data []byte) int64 {
		t.Helper()
		cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		return decodeMemory(data, cfg, format)
	}
	enc := func(img image.Image) []byte {
		var b bytes.Buffer
		if err := png.Encode(&b, img); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	r := image.Rect(0, 0, 100, 80)
	if got := est(enc(image.NewNRGBA(r))); got != 100*80*4 {
		t.Errorf("NRGBA PNG: %d", got)
	}
	gray := enc(image.NewGray(r))
	if got := est(gray); got != 100*80 {
		t.Errorf("gray PNG: %d", got)
	}
	// A tRNS chunk before IDAT: the decoder makes NRGBA of it.
	i := bytes.Index(gray, []byte("IDAT")) - 4
	trns := binary.BigEndian.AppendUint32(nil, 2)
	trns = append(trns, "tRNS\x00\x00"...)
	trns = binary.BigEndian.AppendUint32(trns, crc32.ChecksumIEEE(trns[4:]))
	if got := est(append(append(append([]byte(nil), gray[:i]...), trns...), gray[i:]...)); got != 100*80*4 {
		t.Errorf("gray PNG with tRNS: %d", got)
	}
	if got := est(enc(image.NewRGBA64(r))); got != 100*80*8 {
		t.Errorf("16-bit PNG: %d", got)
	}
	interlaced := enc(image.NewNRGBA(r))
	interlaced[28] = 1 // IHDR's interlace method, and its checksum after it
	binary.BigEndian.PutUint32(interlaced[29:], crc32.ChecksumIEEE(interlaced[12:29]))
	if got := est(interlaced); got != 100*80*6 {
		t.Errorf("Adam7 PNG: %d", got)
	}

	// Go's encoder writes baseline 4:2:0: Y in 16x16 MCUs, Cb and Cr a quarter.
	var jb bytes.Buffer
	if err := jpeg.Encode(&jb, image.NewRGBA(image.Rect(0, 0, 100, 70)), nil); err != nil {
		t.Fatal(err)
	}
	baseline := int64(112*80 + 2*56*40)
	if got := est(jb.Bytes()); got != baseline {
		t.Errorf("baseline JPEG: %d, want %d", got, baseline)
	}
	// The same frame marked progressive: four bytes of coefficients a sample besides.
	prog := bytes.Replace(jb.Bytes(), []byte{0xff, 0xc0}, []byte{0xff, 0xc2}, 1)
	if _, err := jpeg.DecodeConfig(bytes.NewReader(prog)); err != nil {
		t.Fatal(err)
	}
	if got := est(prog); got != 5*baseline {
		t.Errorf("progressive JPEG: %d, want %d", got, 5*baseline)
	}
}

// TestReadImageTooLarge: the refusal names the image, what decoding it takes, the limit the
// host gave (TOOLHOST_MEMORY_LIMIT_MIB) and what to do.
func TestReadImageTooLarge(t *testing.T) {
	w := pdktest.New(t)
	t.Setenv("TOOLHOST_MEMORY_LIMIT_MIB", "32")
	w.Write("big.png", string(testPNG(t, 3000, 3000)))
	got, isErr := w.Call("read_file", `{"path":"big.png"}`)
	for _, want := range []string{"Error: big.png is 3000x3000 (PNG)", "about 44 MiB to decode and scale", "its memory limit is 32 MiB", "scale it down first"} {
		if !isErr || !strings.Contains(got, want) {
			t.Errorf("%v %q does not say %q", isErr, got, want)
		}
	}
}
