go test fuzz v1
[]byte("{\"model\":\"gpt-4.1\",\"input\":\"hi\",\"tools\":[{\"type\":\"mcp\",\"server_label\":\"x\",\"server_url\":\"https://mcp.example.com\"}]}\x0a")
