"""A step outside the live page: one offline HTML file (`html`, from `data`, its graph's views laid out by
`views`) and the notebook display (`inline`)."""
