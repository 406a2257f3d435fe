// Command sizecheck lists the non-test Go files over -file lines and the functions over
// -func lines (a function whose body is mostly one composite literal, a declarative table,
// is not counted), and exits 1 when -strict is set and something is listed. Generated files
// are skipped. Run from tools/: go run ./sizecheck -root ..
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	root := flag.String("root", ".", "repository root")
	maxFile := flag.Int("file", 400, "most lines of a non-test file")
	maxFunc := flag.Int("func", 80, "most lines of a function, tables aside")
	strict := flag.Bool("strict", false, "exit 1 when anything is over")
	flag.Parse()
	var over []string
	err := filepath.WalkDir(*root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "tools":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		found, err := check(p, *maxFile, *maxFunc)
		over = append(over, found...)
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizecheck:", err)
		os.Exit(2)
	}
	sort.Strings(over)
	for _, o := range over {
		fmt.Println(o)
	}
	if len(over) > 0 {
		fmt.Printf("%d over the limits (files %d lines, functions %d lines)\n", len(over), *maxFile, *maxFunc)
		if *strict {
			os.Exit(1)
		}
	}
}

// check lists what in file p is over the limits.
func check(p string, maxFile, maxFunc int) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	if ast.IsGenerated(f) {
		return nil, nil
	}
	var out []string
	if n := fset.File(f.Pos()).LineCount(); n > maxFile {
		out = append(out, fmt.Sprintf("%s: file of %d lines", p, n))
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
		if lines > maxFunc && !table(fset, fn.Body, lines) {
			out = append(out, fmt.Sprintf("%s:%d: func %s of %d lines", p, fset.Position(fn.Pos()).Line, name(fn), lines))
		}
	}
	return out, nil
}

// table says whether body is a declarative table: its composite literals cover two thirds
// of it (the rest being the small parsers or builders its entries use).
func table(fset *token.FileSet, body *ast.BlockStmt, lines int) bool {
	covered := 0
	for _, st := range body.List {
		ast.Inspect(st, func(n ast.Node) bool {
			if cl, ok := n.(*ast.CompositeLit); ok {
				covered += fset.Position(cl.End()).Line - fset.Position(cl.Pos()).Line + 1
				return false
			}
			return true
		})
	}
	return covered*3 >= lines*2
}

func name(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
