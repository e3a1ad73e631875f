// Command browser opens Ray's dashboard in headless Chromium as a person would: the page at -url,
// the login the dashboard asks for (the token read from -token-file, typed into its dialog), then
// the jobs page, until -expect shows on it. It saves a screenshot and prints a JSON report; the token
// is never printed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// report is what the tool prints.
type report struct {
	LoginAsked       bool   // the dashboard showed its token dialog
	LoggedIn         bool   // after the token was submitted the dialog was gone
	JobsShown        bool   // the jobs page showed -expect
	CookieHoldsToken bool   // the login cookie holds the token typed in (not another)
	Title            string // the page's title
	Error            string
}

const tokenInput = `input[placeholder="Enter your authentication token"]`

func main() {
	url := flag.String("url", "", "the dashboard's address")
	tokenFile := flag.String("token-file", "", "file holding the token to log in with")
	expect := flag.String("expect", "", "text the jobs page must show (a job's submission ID)")
	shot := flag.String("screenshot", "", "PNG file for the jobs page")
	chromium := flag.String("chromium", "/usr/bin/chromium", "the browser")
	timeout := flag.Duration("timeout", 2*time.Minute, "for everything")
	flag.Parse()
	r := run(*url, *tokenFile, *expect, *shot, *chromium, *timeout)
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func run(url, tokenFile, expect, shot, chromium string, timeout time.Duration) (r report) {
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	token := strings.TrimSpace(string(b))
	profile, err := os.MkdirTemp("", "chromium-profile-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer os.RemoveAll(profile)
	// The flags this machine needs (no sandbox as root, nothing that calls out), a fresh profile that
	// also takes Chromium's temporary files (its singleton socket directory outlived every run in
	// $TMPDIR), and no proxy: the dashboard is on loopback.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.UserDataDir(profile), chromedp.Env("TMPDIR="+profile),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-proxy-server", true), chromedp.WindowSize(1400, 1000))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()

	do := func(name string, steps ...chromedp.Action[chromedp.Void]) bool {
		if err := chromedp.Do(ctx, steps...); err != nil {
			r.Error = fmt.Sprintf("%s: %v", name, err)
			return false
		}
		return true
	}
	if !do("open the dashboard", chromedp.Navigate(url+"/#/jobs"), chromedp.WaitVisible(chromedp.CSS(tokenInput))) {
		return r
	}
	r.LoginAsked = true
	if !do("log in", chromedp.SendKeys(chromedp.CSS(tokenInput), token+kb.Enter)) {
		return r
	}
	// The dashboard reloads once the gateway accepts the token; then the jobs list shows the job.
	if !do("show the jobs page", chromedp.WaitVisible(chromedp.Search(fmt.Sprintf(`//*[contains(text(), %q)]`, expect)))) {
		return r
	}
	r.JobsShown = true
	if r.Title, err = chromedp.Run(ctx, chromedp.Title()); err != nil {
		r.Error = "read the title: " + err.Error()
		return r
	}
	dialogs, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('`+tokenInput+`').length`))
	if err != nil {
		r.Error = "read the page: " + err.Error()
		return r
	}
	r.LoggedIn = dialogs == 0
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err == nil {
		err = os.WriteFile(shot, png, 0o644)
	}
	if err != nil {
		r.Error = "screenshot: " + err.Error()
		return r
	}
	cookies, err := chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) ([]*network.Cookie, error) {
		res, err := cdp.Call(ctx, t, network.GetCookies, network.GetCookiesParams{})
		return res.Cookies, err
	})
	if err != nil {
		r.Error = "read the cookies: " + err.Error()
		return r
	}
	for _, c := range cookies {
		if c.Name == "ray-authentication-token" {
			r.CookieHoldsToken = c.Value == token
		}
	}
	return r
}
