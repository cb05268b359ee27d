package main

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
)

//go:embed page.html
var pageHTML string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"euros": formatEuros,
}).Parse(pageHTML))

// page answers GET /: the catalogue, a checkout form and the user's
// orders. A visitor without a valid session cookie gets a new one.
func (s *shop) page(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	user, err := s.sessions.user(r)
	if err != nil {
		var c *http.Cookie
		user, c = s.sessions.issue(r)
		http.SetCookie(w, c)
	}
	products, err := s.products(ctx)
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	orders, err := s.ordersOf(ctx, user)
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, map[string]any{"User": user, "Products": products, "Orders": orders}); err != nil {
		s.answerTxError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store") // a page from the cache would bring back an old checkout key
	_, _ = w.Write(buf.Bytes())
}

// products returns the catalogue.
func (s *shop) products(ctx context.Context) ([]product, error) {
	var ps []product
	err := s.db.each(ctx, `SELECT sku, name, price_cents, stock FROM products ORDER BY price_cents`, nil, func(r row) error {
		var p product
		err := r.Scan(&p.SKU, &p.Name, &p.PriceCents, &p.Stock)
		ps = append(ps, p)
		return err
	})
	return ps, err
}

// formatEuros writes cents as euros: 1200 → "€12.00".
func formatEuros(cents int64) string { return fmt.Sprintf("€%d.%02d", cents/100, cents%100) }
