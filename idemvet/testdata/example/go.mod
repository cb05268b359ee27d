module example.com/reserve

go 1.22
