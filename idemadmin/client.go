package idemadmin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client speaks the admin API of a running `idem serve` (its --admin
// listener), as `idem review` and `idem keys` do with --admin-url.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// NewClient returns a client of the admin API at baseURL
// (http://127.0.0.1:9090) that authorizes with token. A nil httpClient
// means one with a 30s timeout. The client never follows a redirect: the
// token must not travel to another address.
func NewClient(baseURL, token string, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(strings.TrimSuffix(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("admin URL %q must be http:// or https:// with a host, as in http://127.0.0.1:9090", baseURL)
	}
	if token == "" {
		return nil, fmt.Errorf("the admin API at %s needs a token: --admin-token-file PATH or IDEM_ADMIN_TOKEN", u.Redacted())
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	noRedirects := *httpClient
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	httpClient = &noRedirects
	return &Client{base: u, token: token, http: httpClient}, nil
}

// List returns a page of keys.
func (c *Client) List(ctx context.Context, q ListQuery) (Page, error) {
	var page Page
	err := c.do(ctx, http.MethodGet, "/api/v1/keys", q.Values(), nil, &page)
	return page, err
}

// Counts returns an overview of the keys.
func (c *Client) Counts(ctx context.Context) (Counts, error) {
	var counts Counts
	err := c.do(ctx, http.MethodGet, "/api/v1/counts", nil, nil, &counts)
	return counts, err
}

// Get returns one key, with its detail.
func (c *Client) Get(ctx context.Context, id string) (Item, error) {
	var it Item
	err := c.do(ctx, http.MethodGet, "/api/v1/keys/"+url.PathEscape(id), nil, nil, &it)
	return it, err
}

// Resolve settles a key that needs review.
func (c *Client) Resolve(ctx context.Context, id string, req ResolveRequest) (Result, error) {
	var res Result
	err := c.do(ctx, http.MethodPost, "/api/v1/keys/"+url.PathEscape(id)+"/resolve", nil, req, &res)
	return res, err
}

// Delete removes a completed key.
func (c *Client) Delete(ctx context.Context, id string, req DeleteRequest) (Result, error) {
	var res Result
	err := c.do(ctx, http.MethodDelete, "/api/v1/keys/"+url.PathEscape(id), nil, req, &res)
	return res, err
}

// Bulk settles many keys in review at once (POST /api/v1/keys/bulk).
func (c *Client) Bulk(ctx context.Context, req BulkRequest) (BulkResult, error) {
	var res BulkResult
	err := c.do(ctx, http.MethodPost, "/api/v1/keys/bulk", nil, req, &res)
	return res, err
}

// do sends one request and decodes the answer into out, or returns an
// *Error built from the problem document.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	target := c.base.String() + path // path's parts are escaped already
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", c.base.Redacted(), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API at %s: reading the answer: %w", c.base.Redacted(), err)
	}
	if resp.StatusCode/100 != 2 {
		var p problem
		if json.Unmarshal(b, &p) != nil || p.Detail == "" {
			p.Detail = fmt.Sprintf("admin API at %s answered %s: %s", c.base.Redacted(), resp.Status, cut(strings.TrimSpace(string(b)), 200))
		}
		if p.Code == "" {
			p.Code = CodeInternal
		}
		return &Error{Status: resp.StatusCode, Code: p.Code, Detail: p.Detail}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("admin API at %s: the answer is not the JSON expected: %w", c.base.Redacted(), err)
	}
	return nil
}
