package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"runtime"
	"strconv"
	"strings"

	"github.com/HugoSmits86/nativewebp"
	"golang.org/x/image/draw"
	"golang.org/x/image/webp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

// read_file sees: images come back as image content (downscaled to what a model is shown,
// re-encoded as WebP where that is smaller), PDFs as text page by page (or pages as
// images), Jupyter notebooks as their cells with their outputs. Decoding happens here, in
// the plugin's own sandbox: an image or a notebook is the sandbox's output, hostile input
// to anything that parses it, and a decoder bomb here costs one instance at its memory
// limit, never the host. What an image's decoding and encoding take is estimated from its
// header and checked against that limit first, so that an image too large is refused
// with a word for the model instead of the instance running out of memory. PDFs are read
// by poppler's pdftotext and pdftoppm inside the sandbox, for the same reason.

const (
	// maxImageEdge is the longest side an image is shown at: what the Anthropic API
	// scales larger images down to anyway (sending more only costs time).
	maxImageEdge = 1568
	// maxImageBytes keeps an image under the API's 5 MB of base64.
	maxImageBytes = 3_750_000
	// maxImagePixels bounds the work of decoding and scaling one image; what decoding
	// would take in memory is bounded apart (decodeMemory against the instance's limit).
	maxImagePixels = 40_000_000
	// maxPDFPages is the most pages one call shows as text; maxPDFImages as images.
	maxPDFPages  = 20
	maxPDFImages = 5
)

// mediaKind tells from a path's extension what read_file shows it as ("" for text).
func mediaKind(path string) string {
	dot := strings.LastIndexByte(path, '.')
	if dot < 0 || strings.ContainsRune(path[dot:], '/') {
		return ""
	}
	switch strings.ToLower(path[dot+1:]) {
	case "png", "jpg", "jpeg", "gif", "webp":
		return "image"
	case "pdf":
		return "pdf"
	case "ipynb":
		return "notebook"
	}
	return ""
}

// sniff tells an image or a PDF by its first bytes.
func sniff(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")), bytes.HasPrefix(b, []byte("\xff\xd8\xff")),
		bytes.HasPrefix(b, []byte("GIF87a")), bytes.HasPrefix(b, []byte("GIF89a")),
		len(b) >= 12 && bytes.Equal(b[:4], []byte("RIFF")) && bytes.Equal(b[8:12], []byte("WEBP")):
		return "image"
	case bytes.HasPrefix(b, []byte("%PDF-")):
		return "pdf"
	}
	return ""
}

func readMedia(in pdk.Input, path, kind string) abi.Result {
	if kind == "pdf" {
		return readPDF(in, path)
	}
	data, version, err := pdk.ReadFileVersioned(path)
	if err != nil {
		return readError(path, err)
	}
	markSeen(path, version)
	if kind == "notebook" {
		return readNotebook(path, data)
	}
	return readImage(path, data)
}

// readBinary shows a file read_text found binary: an image or a PDF when its first bytes
// say so, else the refusal.
func readBinary(in pdk.Input, path string) abi.Result {
	data, version, err := pdk.ReadFileVersioned(path)
	if err != nil {
		return readError(path, err)
	}
	switch sniff(data) {
	case "image":
		markSeen(path, version)
		return readImage(path, data)
	case "pdf":
		return readPDF(in, path)
	}
	return abi.ErrorText("Error: " + path + " is a binary file; read_file shows text, images (PNG, JPEG, GIF, WebP), PDFs and notebooks")
}

func readError(path string, err error) abi.Result {
	if errors.Is(err, pdk.ErrIsDir) {
		return abi.ErrorText("Error: " + path + " is a directory; use glob or bash ls to list it")
	}
	return abi.ErrorText("Error: could not read " + path + ": " + reason(err, path))
}

var imageTypes = map[string]string{"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}

// readImage returns the image as it is when it is within what a model is shown, else
// scaled down and re-encoded.
func readImage(path string, data []byte) abi.Result {
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return abi.ErrorText("Error: " + path + " is not an image read_file can decode (PNG, JPEG, GIF or WebP): " + err.Error())
	}
	mt := imageTypes[format]
	desc := "[image " + path + ": " + strings.ToUpper(format) + ", " + dims(cfg.Width, cfg.Height) + ", " + size(len(data))
	if cfg.Width <= maxImageEdge && cfg.Height <= maxImageEdge && len(data) <= maxImageBytes && mt != "" {
		return imageResult(desc+"]", mt, data)
	}
	if cfg.Width*cfg.Height > maxImagePixels {
		return abi.ErrorText("Error: " + path + " is " + dims(cfg.Width, cfg.Height) + ", too large to decode here (at most " +
			strconv.Itoa(maxImagePixels/1_000_000) + " megapixels); " + scaleDown)
	}
	w, h := fit(cfg.Width, cfg.Height, maxImageEdge)
	// Decoding, then scaling into the w x h image, must fit in what the instance has left.
	if need, room := decodeMemory(data, cfg, format)+int64(w)*int64(h)*4, memoryRoom(); need > room {
		return abi.ErrorText("Error: " + path + " is " + dims(cfg.Width, cfg.Height) + " (" + strings.ToUpper(format) + "), which takes about " +
			mib(need) + " to decode and scale, and read_file has " + mib(room) + " for it (its memory limit is " + mib(memoryLimit()) + "); " + scaleDown)
	}
	img, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		return abi.ErrorText("Error: " + path + " could not be decoded: " + err.Error())
	}
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	draw.ApproxBiLinear.Scale(dst, dst.Bounds(), img, img.Bounds(), draw.Src, nil)
	img = nil
	runtime.GC() // what decoding took is the encoder's now
	out, outType := encodeSmallest(dst, format == "jpeg", memoryRoom())
	return imageResult(desc+"; shown at "+dims(w, h)+" as "+strings.TrimPrefix(outType, "image/")+", "+size(len(out))+"]", outType, out)
}

// scaleDown is what to do with an image too large to decode.
const scaleDown = "scale it down first, to at most 1568x1568 (what a model is shown), and read the smaller copy (for example `convert big.png -resize 1568x1568 small.png` with ImageMagick, or python3 with Pillow)"

// The memory decoding may take. The host tells each instance its memory limit
// (TOOLHOST_MEMORY_LIMIT_MIB, ABI.md section 6); past it the instance would run out of
// memory and the call fail with no word for the model, so an image that would not fit is
// refused, saying so, before it is decoded.
const (
	// defaultMemoryMiB is the host's default limit, for a host that does not say.
	defaultMemoryMiB = 128
	// memoryMargin is kept for what the estimates leave out: the module's own data (3.4
	// MiB of initial memory), the decoders' and encoders' buffers.
	memoryMargin = 16 << 20
)

// memoryLimit is this instance's memory limit in bytes.
func memoryLimit() int64 {
	if n, err := strconv.Atoi(pdk.Config("TOOLHOST_MEMORY_LIMIT_MIB")); err == nil && n > 0 {
		return int64(n) << 20
	}
	return defaultMemoryMiB << 20
}

// memoryRoom is how many bytes the plugin may still take: the limit, less what it holds
// now, less the margin.
func memoryRoom() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	held := int64(ms.Sys - ms.HeapIdle) // idle heap is reused before memory grows
	return max(0, memoryLimit()-held-memoryMargin)
}

// decodeMemory estimates what decoding data (whose header said cfg and format) takes in
// memory: the decoded image, and what the decoder holds besides it while it works. It
// errs high where the header does not tell.
func decodeMemory(data []byte, cfg image.Config, format string) int64 {
	px := int64(cfg.Width) * int64(cfg.Height)
	switch format {
	case "png":
		n := px * pngBytesPerPixel(data, cfg.ColorModel)
		if len(data) > 28 && data[28] == 1 {
			n += n / 2 // Adam7: each pass is decoded into an image of its own, then merged
		}
		return n
	case "gif":
		return px // the first frame, paletted
	case "jpeg":
		return jpegMemory(data, cfg)
	case "webp":
		if len(data) >= 16 && string(data[12:16]) == "VP8 " {
			return px * 3 / 2 // lossy without alpha: Y'CbCr 4:2:0
		}
		return px * 8 // lossless or with alpha: NRGBA, and the decoder's own pixels
	}
	return px * 8
}

// pngBytesPerPixel is what the PNG decoder's image takes a pixel: by the color model its
// header gives, except that a gray image with a tRNS chunk decodes to NRGBA.
func pngBytesPerPixel(data []byte, m color.Model) int64 {
	switch m {
	case color.GrayModel:
		if pngHasTRNS(data) {
			return 4
		}
		return 1
	case color.Gray16Model:
		if pngHasTRNS(data) {
			return 8
		}
		return 2
	case color.RGBAModel, color.NRGBAModel:
		return 4
	}
	if _, ok := m.(color.Palette); ok {
		return 1
	}
	return 8
}

// pngHasTRNS reports whether a tRNS chunk comes before the image data.
func pngHasTRNS(data []byte) bool {
	for i := 8; i+8 <= len(data); {
		n := int(binary.BigEndian.Uint32(data[i:]))
		switch string(data[i+4 : i+8]) {
		case "tRNS":
			return true
		case "IDAT", "IEND":
			return false
		}
		if n < 0 || n > len(data) {
			return false
		}
		i += 12 + n
	}
	return false
}

// jpegMemory is what the JPEG decoder takes: the samples of every component (padded to
// whole blocks), and for a progressive JPEG its coefficients too (four bytes a sample);
// a four-component (CMYK) one is converted into an image of four bytes a pixel besides.
func jpegMemory(data []byte, cfg image.Config) int64 {
	px := int64(cfg.Width) * int64(cfg.Height)
	progressive, comps, ok := jpegFrame(data)
	if !ok {
		return px * 24 // unread: as if progressive, four components, no subsampling
	}
	hmax, vmax := 1, 1
	if len(comps) > 1 {
		for _, c := range comps {
			hmax, vmax = max(hmax, c[0]), max(vmax, c[1])
		}
	}
	// Whole MCUs, as the decoder allocates them: 8*hmax x 8*vmax pixels each.
	mx, my := int64((cfg.Width+8*hmax-1)/(8*hmax)), int64((cfg.Height+8*vmax-1)/(8*vmax))
	var samples int64
	for _, c := range comps {
		h, v := min(c[0], hmax), min(c[1], vmax)
		samples += 8 * int64(h) * mx * 8 * int64(v) * my
	}
	n := samples
	if progressive {
		n += 4 * samples
	}
	if len(comps) == 4 {
		n += 4 * px
	}
	return n
}

// jpegFrame reads a JPEG's frame header: whether it is progressive, and each component's
// sampling factors (horizontal, vertical).
func jpegFrame(data []byte) (progressive bool, comps [][2]int, ok bool) {
	for i := 2; i+4 <= len(data); {
		if data[i] != 0xff {
			return false, nil, false
		}
		m := data[i+1]
		if m == 0xff { // fill
			i++
			continue
		}
		if m == 0xd8 || m == 0x01 || (m >= 0xd0 && m <= 0xd7) { // no length
			i += 2
			continue
		}
		n := int(data[i+2])<<8 | int(data[i+3])
		if n < 2 || i+2+n > len(data) {
			return false, nil, false
		}
		if m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc {
			seg := data[i+4 : i+2+n] // P, Y, X, Nf, then Nf of (C, H<<4|V, Tq)
			if len(seg) < 6 || len(seg) < 6+3*int(seg[5]) || seg[5] == 0 {
				return false, nil, false
			}
			for k := range int(seg[5]) {
				hv := seg[6+3*k+1]
				comps = append(comps, [2]int{max(1, int(hv>>4)), max(1, int(hv&15))})
			}
			return m == 0xc2 || m == 0xc6 || m == 0xca || m == 0xce, comps, true
		}
		i += 2 + n
	}
	return false, nil, false
}

// mib is n bytes in MiB, whole.
func mib(n int64) string { return strconv.FormatInt((n+(1<<20)-1)>>20, 10) + " MiB" }

// webpBytesPerPixel is what nativewebp's lossless encoder takes for each pixel of the
// image it encodes (its pixels, hash chain and tokens, held at once: 52 bytes allocated,
// and in a plugin instance the memory grew by 54 for a 1568x1176 image).
const webpBytesPerPixel = 54

// encodeSmallest encodes img as lossless WebP and, for a photo (the source was a JPEG),
// as JPEG too, and keeps the smaller. WebP's encoder takes many times the image's own
// memory: past room bytes it is not tried, and the image is PNG (or JPEG, for a photo).
func encodeSmallest(img image.Image, photo bool, room int64) ([]byte, string) {
	var wb bytes.Buffer
	errW := errors.New("webp: not enough memory to encode")
	if b := img.Bounds(); int64(b.Dx())*int64(b.Dy())*webpBytesPerPixel <= room {
		errW = encodeWebP(&wb, img)
	}
	if photo {
		var jb bytes.Buffer
		if jpeg.Encode(&jb, img, &jpeg.Options{Quality: 85}) == nil && (errW != nil || jb.Len() < wb.Len()) {
			return jb.Bytes(), "image/jpeg"
		}
	}
	if errW != nil {
		var pb bytes.Buffer
		_ = png.Encode(&pb, img)
		return pb.Bytes(), "image/png"
	}
	return wb.Bytes(), "image/webp"
}

// encodeWebP is nativewebp's lossless encoder with its panics made errors: an image of
// high entropy (noise) makes it panic ("too many bits for the given value"), and the
// caller then falls back to PNG or JPEG.
func encodeWebP(w *bytes.Buffer, img image.Image) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.Reset()
			err = fmt.Errorf("webp: %v", r)
		}
	}()
	return nativewebp.Encode(w, img, nil)
}

func fit(w, h, edge int) (int, int) {
	if w <= edge && h <= edge {
		return w, h
	}
	if w >= h {
		return edge, max(1, h*edge/w)
	}
	return max(1, w*edge/h), edge
}

func imageResult(text, mediaType string, data []byte) abi.Result {
	return abi.Result{Content: []abi.Content{
		{Type: abi.ContentText, Text: text},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: mediaType, Raw: data}},
	}}
}

func dims(w, h int) string { return strconv.Itoa(w) + "x" + strconv.Itoa(h) }

func size(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n) + " bytes"
}

// ---- PDF

// pdfPath is a workspace file as a command's argument: relative to the workspace root,
// where commands start, and never starting with '-'.
func pdfPath(path string) string { return "./" + relPath(path) }

func readPDF(in pdk.Input, path string) abi.Result {
	abs := pdfPath(path)
	info, err := pdk.Exec(abi.ExecRequest{Argv: []string{"pdfinfo", abs}, TimeoutMS: 30_000})
	if err != nil {
		return abi.ErrorText("Error: could not read " + path + ": " + err.Error())
	}
	if info.ExitCode == 127 {
		return abi.ErrorText("Error: reading a PDF needs poppler's pdfinfo, pdftotext and pdftoppm in the sandbox, and pdfinfo was not found: install poppler-utils (apt-get install poppler-utils), or convert the PDF another way")
	}
	if info.ExitCode != 0 {
		return abi.ErrorText("Error: " + path + " could not be read as a PDF: " + strings.TrimSpace(info.Stderr))
	}
	pages := 0
	for _, l := range strings.Split(info.Stdout, "\n") {
		if v, ok := strings.CutPrefix(l, "Pages:"); ok {
			pages, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if pages < 1 {
		return abi.ErrorText("Error: " + path + " has no pages")
	}
	first, last := 1, min(pages, maxPDFPages)
	if in.Has("pages") {
		var msg string
		if first, last, msg = pageRange(in.String("pages"), pages); msg != "" {
			return abi.ErrorText("Error: " + msg)
		}
	}
	if in.Bool("pages_as_images") {
		return pdfImages(path, abs, first, last, pages)
	}
	if last-first+1 > maxPDFPages {
		return abi.ErrorText("Error: pages " + strconv.Itoa(first) + "-" + strconv.Itoa(last) + " are more than the " + strconv.Itoa(maxPDFPages) + " pages one call shows; ask for fewer")
	}
	res, err := pdk.Exec(abi.ExecRequest{Argv: []string{"pdftotext", "-layout", "-enc", "UTF-8", "-f", strconv.Itoa(first), "-l", strconv.Itoa(last), abs, "-"}, TimeoutMS: 60_000})
	if err != nil {
		return abi.ErrorText("Error: could not read " + path + ": " + err.Error())
	}
	if res.ExitCode != 0 {
		return abi.ErrorText("Error: pdftotext could not read " + path + ": " + strings.TrimSpace(res.Stderr))
	}
	var b strings.Builder
	b.WriteString("[PDF " + path + ": " + plural(pages, "page") + "; pages " + strconv.Itoa(first) + "-" + strconv.Itoa(last) + " as text]\n")
	texts := strings.Split(res.Stdout, "\f")
	for i := 0; i <= last-first; i++ {
		t := ""
		if i < len(texts) {
			t = strings.TrimRight(texts[i], " \n")
		}
		b.WriteString("\n--- page " + strconv.Itoa(first+i) + " ---\n")
		if strings.TrimSpace(t) == "" {
			t = "[no text on this page: it may be a scan or a drawing; read it with pages_as_images]"
		}
		b.WriteString(t + "\n")
	}
	if last < pages {
		b.WriteString("\n[pages " + strconv.Itoa(last+1) + "-" + strconv.Itoa(pages) + " not shown; read them with pages: \"" +
			strconv.Itoa(last+1) + "-" + strconv.Itoa(min(pages, last+maxPDFPages)) + "\"]\n")
	}
	return abi.Text(b.String())
}

// pageRange reads "3" or "2-5" (1-based, inclusive) against a document of n pages.
func pageRange(s string, n int) (first, last int, msg string) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	var err1, err2 error
	first, err1 = strconv.Atoi(strings.TrimSpace(a))
	last = first
	if isRange {
		last, err2 = strconv.Atoi(strings.TrimSpace(b))
	}
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, "pages " + strconv.Quote(s) + " is not a page or a range like \"3\" or \"2-5\""
	case first < 1 || last < first || last > n:
		return 0, 0, "pages " + strconv.Quote(s) + " is outside the document, which has " + plural(n, "page") + " (1-" + strconv.Itoa(n) + ")"
	}
	return first, last, ""
}

// pdfImages renders pages as JPEG images, one pdftoppm per page (its output on stdout).
func pdfImages(path, abs string, first, last, pages int) abi.Result {
	if last-first+1 > maxPDFImages {
		return abi.ErrorText("Error: at most " + strconv.Itoa(maxPDFImages) + " pages are shown as images in one call; ask for fewer (pages: \"" +
			strconv.Itoa(first) + "-" + strconv.Itoa(first+maxPDFImages-1) + "\")")
	}
	r := abi.Result{Content: []abi.Content{{Type: abi.ContentText, Text: "[PDF " + path + ": " + plural(pages, "page") +
		"; pages " + strconv.Itoa(first) + "-" + strconv.Itoa(last) + " as images]"}}}
	for p := first; p <= last; p++ {
		var img []byte
		for _, edge := range []int{maxImageEdge, 1000} {
			res, err := pdk.Exec(abi.ExecRequest{Argv: []string{"pdftoppm", "-jpeg", "-jpegopt", "quality=80", "-scale-to", strconv.Itoa(edge),
				"-f", strconv.Itoa(p), "-l", strconv.Itoa(p), abs}, TimeoutMS: 60_000})
			if err != nil {
				return abi.ErrorText("Error: could not render page " + strconv.Itoa(p) + " of " + path + ": " + err.Error())
			}
			if res.ExitCode == 127 {
				return abi.ErrorText("Error: showing PDF pages as images needs poppler's pdftoppm in the sandbox: install poppler-utils")
			}
			if res.ExitCode != 0 {
				return abi.ErrorText("Error: pdftoppm could not render page " + strconv.Itoa(p) + " of " + path + ": " + strings.TrimSpace(res.Stderr))
			}
			if res.StdoutCut == 0 { // the host cuts big output in the middle: try smaller
				img = []byte(res.Stdout)
				break
			}
		}
		if img == nil {
			return abi.ErrorText("Error: page " + strconv.Itoa(p) + " of " + path + " renders larger than a command's output may be")
		}
		r.Content = append(r.Content, abi.Content{Type: abi.ContentText, Text: "--- page " + strconv.Itoa(p) + " ---"},
			abi.Content{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/jpeg", Raw: img}})
	}
	return r
}

// ---- notebooks

type notebook struct {
	Cells    []nbCell `json:"cells"`
	Metadata struct {
		Kernelspec struct {
			Language string `json:"language"`
		} `json:"kernelspec"`
		LanguageInfo struct {
			Name string `json:"name"`
		} `json:"language_info"`
	} `json:"metadata"`
}

type nbCell struct {
	CellType       string     `json:"cell_type"`
	Source         multiline  `json:"source"`
	ExecutionCount *int       `json:"execution_count"`
	Outputs        []nbOutput `json:"outputs"`
}

type nbOutput struct {
	OutputType string               `json:"output_type"`
	Name       string               `json:"name"`
	Text       multiline            `json:"text"`
	Data       map[string]multiline `json:"data"`
	Ename      string               `json:"ename"`
	Evalue     string               `json:"evalue"`
	Traceback  []string             `json:"traceback"`
}

// multiline is a notebook string: one string, or a list of lines.
type multiline string

func (m *multiline) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*m = multiline(s)
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	*m = multiline(strings.Join(l, ""))
	return nil
}

// maxNotebookImages bounds the output images one read shows.
const maxNotebookImages = 10

func readNotebook(path string, data []byte) abi.Result {
	var nb notebook
	if err := json.Unmarshal(data, &nb); err != nil {
		return abi.ErrorText("Error: " + path + " is not a Jupyter notebook (its JSON does not parse: " + err.Error() + "); read it as text with bash (cat)")
	}
	lang := nb.Metadata.Kernelspec.Language
	if lang == "" {
		lang = nb.Metadata.LanguageInfo.Name
	}
	var b strings.Builder
	b.WriteString("[notebook " + path + ": " + plural(len(nb.Cells), "cell"))
	if lang != "" {
		b.WriteString(", " + lang)
	}
	b.WriteString("]\n")
	r := abi.Result{}
	images := 0
	flush := func() {
		if b.Len() > 0 {
			r.Content = append(r.Content, abi.Content{Type: abi.ContentText, Text: b.String()})
			b.Reset()
		}
	}
	for i, c := range nb.Cells {
		b.WriteString("\n--- cell " + strconv.Itoa(i+1) + " (" + c.CellType)
		if c.ExecutionCount != nil {
			b.WriteString(", [" + strconv.Itoa(*c.ExecutionCount) + "]")
		}
		b.WriteString(") ---\n" + strings.TrimRight(string(c.Source), "\n") + "\n")
		for _, o := range c.Outputs {
			switch o.OutputType {
			case "stream":
				b.WriteString("--- output (" + o.Name + ") ---\n" + strings.TrimRight(string(o.Text), "\n") + "\n")
			case "error":
				b.WriteString("--- error: " + o.Ename + ": " + o.Evalue + " ---\n")
				for _, l := range o.Traceback {
					b.WriteString(stripEscapes(l) + "\n")
				}
			case "execute_result", "display_data":
				shown := false
				for _, mt := range []string{"image/png", "image/jpeg", "image/gif", "image/webp"} {
					d, ok := o.Data[mt]
					if !ok || images >= maxNotebookImages {
						continue
					}
					raw, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(string(d), "\n", ""))
					if err != nil {
						continue
					}
					b.WriteString("--- output (" + mt + ") ---\n")
					flush()
					img := readImage(path+" cell "+strconv.Itoa(i+1), raw)
					if !img.IsError && len(img.Content) == 2 {
						r.Content = append(r.Content, img.Content[1])
						images++
						shown = true
					}
					break
				}
				if t, ok := o.Data["text/plain"]; ok && !shown {
					b.WriteString("--- output ---\n" + strings.TrimRight(string(t), "\n") + "\n")
				}
			}
		}
	}
	flush()
	return r
}

// stripEscapes drops the ANSI colour codes of a traceback line.
func stripEscapes(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var _ = gif.Decode // registers GIF with image.Decode
var _ = webp.Decode
