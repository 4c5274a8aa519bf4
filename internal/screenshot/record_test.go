package screenshot

import "testing"

func TestCaptureOrder(t *testing.T) {
	keys := []string{
		"screenshots/p/agent/20261121T095949Z_desktop.webp",
		"screenshots/p/agent/20261121T095949Z_01_desktop.webp",
		"screenshots/p/auto/20261121T095950Z_mobile.webp",
	}
	if !(captureOrder(keys[1]) > captureOrder(keys[0]) && captureOrder(keys[2]) > captureOrder(keys[1])) {
		t.Fatalf("order: %q %q %q", captureOrder(keys[0]), captureOrder(keys[1]), captureOrder(keys[2]))
	}
}
