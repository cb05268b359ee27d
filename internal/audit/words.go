package audit

import (
	"strings"
	"unicode"
)

// sensitive maps every accepted word form to the topic it signals. A word
// matches only as a whole word part (see wordParts), so "payments" and
// "createPayment" match while "payload", "display", "accountant" and
// "appointments" do not.
var sensitive = map[string]string{}

func init() {
	for topic, forms := range map[string][]string{
		"pay":      {"pay", "pays", "paid", "paying", "payment", "payments", "payout", "payouts", "payer", "payers", "payee", "payees"},
		"charge":   {"charge", "charges", "charged", "charging", "chargeback", "chargebacks"},
		"order":    {"order", "orders", "ordered", "reorder", "reorders", "suborder", "suborders"},
		"checkout": {"checkout", "checkouts"},
		"transfer": {"transfer", "transfers", "transferred", "transferring"},
		"refund":   {"refund", "refunds", "refunded", "refunding"},
		"email":    {"email", "emails", "emailed", "emailing", "mail", "mails", "mailing"},
		"send":     {"send", "sends", "sending", "sent", "resend", "resends"},
		"invite":   {"invite", "invites", "invited", "inviting", "invitation", "invitations"},
		"signup":   {"signup", "signups"},
		"account":  {"account", "accounts"},
		"points":   {"point", "points"},
	} {
		for _, f := range forms {
			sensitive[f] = topic
		}
	}
}

// bigrams are two word parts that mean one sensitive word when adjacent
// ("sign_up", "check-out", "e-mail").
var bigrams = map[[2]string]string{
	{"sign", "up"}:   "signup",
	{"sign", "ups"}:  "signup",
	{"check", "out"}: "checkout",
	{"e", "mail"}:    "email",
	{"e", "mails"}:   "email",
}

// sensitiveWord returns the first word part of s that suggests money or
// messages, or "" when there is none.
func sensitiveWord(s string) string {
	parts := wordParts(s)
	for i, p := range parts {
		if i+1 < len(parts) {
			if _, ok := bigrams[[2]string{p, parts[i+1]}]; ok {
				return p + parts[i+1]
			}
		}
		if _, ok := sensitive[p]; ok {
			return p
		}
	}
	return ""
}

// wordParts splits s into lower-case word parts at punctuation, spaces,
// digits and case changes: "createPaymentIntent" → create, payment, intent;
// "/v1/refunds/{id}" → v, refunds, id; "HTTPServer" → http, server. Glued
// lower-case words ("paymentintent") stay one part.
func wordParts(s string) []string {
	var parts []string
	rs := []rune(s)
	start := -1
	flush := func(end int) {
		if start >= 0 && end > start {
			parts = append(parts, strings.ToLower(string(rs[start:end])))
		}
		start = -1
	}
	for i, r := range rs {
		if !unicode.IsLetter(r) {
			flush(i)
			continue
		}
		if start < 0 {
			start = i
			continue
		}
		prev := rs[i-1]
		switch {
		case unicode.IsLower(prev) && unicode.IsUpper(r):
			// camelCase boundary: "createPayment" → create | Payment
			flush(i)
			start = i
		case unicode.IsUpper(prev) && unicode.IsUpper(r) && i+1 < len(rs) && unicode.IsLower(rs[i+1]):
			// acronym boundary: "HTTPServer" → HTTP | Server
			flush(i)
			start = i
		}
	}
	flush(len(rs))
	return parts
}
