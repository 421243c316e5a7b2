package testlayer
import ("testing";"archive/tar";"bytes";"io")
func TestTar(t *testing.T){ tr:=tar.NewReader(bytes.NewReader(Tar())); n:=0; for { h,err:=tr.Next(); if err==io.EOF{break}; if err!=nil{t.Fatal(err)}; n++; _=h}; if n < 30 {t.Fatal(n)}; t.Log(n, len(Tar())) }
