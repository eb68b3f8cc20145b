// Package web is the operator dashboard: server-rendered templ pages over the
// store's read model, a login that turns a token into a server-side session,
// CSRF-checked operator writes, and a Server-Sent Events stream that keeps an
// open page current.
//
// Every page has one view model built by its handler from store reads;
// components only format what the view model holds, so nothing rendered can
// reach a value the view model did not copy (dispatch secrets and their
// hashes are never copied). The pages work without JavaScript; static/app.js
// adds live updates and the force-release dialog.
package web
